//! Delivery of a session's messages to its agent's stdin, one JSON line
//! each, in order, each as a stdin frame numbered by its sequence: the
//! runner writes a sequence once per exec, so a message written by an owner
//! that died before recording it, or by a stale owner, is not written again.
//!
//! Frames go from the process's `delivered_seq`; the `stdin_sequence` the
//! runner answers is recorded by `ProcessStore::mark_delivered`, which also sets
//! the messages' `delivered_at_ms` and, when `delivered_seq` advanced,
//! writes one `delivered` event, in the same transaction.

use std::sync::Arc;

use troupe_proto::{
    agent::MessageLine,
    runner::{StdinFrame, WriteStdinRequest},
};

use super::{Driver, Term};
use crate::{
    error::SessionError,
    model::{SessionId, SessionRow},
    store::Store,
};

impl<S: Store> Driver<S> {
    /// The messages not yet written to `recipient`'s agent, as it may see
    /// them: a sandboxed agent is never told a direct session's id, so such
    /// a sender reads `session`, as in every view of the ledger.
    pub(super) async fn inbox_for(
        &self,
        recipient: &SessionRow,
    ) -> Result<Vec<MessageLine>, SessionError> {
        let pending = self.store.undelivered(&recipient.session_id).await?;
        let mut lines = Vec::with_capacity(pending.len());
        for m in pending {
            let visible = match m.sender.session_id() {
                Some(sender) => match self.store.get_session(sender).await? {
                    Some(row) => crate::policy::trust_sees(recipient.trust, row.trust),
                    None => false,
                },
                None => true,
            };
            let sender = if visible {
                m.sender.to_string()
            } else {
                "session".to_owned()
            };
            lines.push(MessageLine::new(m.seq, &m.message_id, &sender, &m.body));
        }
        Ok(lines)
    }

    /// Writes the session's undelivered messages to its agent's stdin; true
    /// if every message stored so far has reached it. The runner skips the
    /// frames its exec has received already and answers the last sequence
    /// received; the delivery is recorded up to that after the answer, still
    /// under the session's delivery lock, so the next delivery starts after
    /// it. A record lost to a crash costs nothing: the next owner's frames
    /// are skipped by the runner.
    ///
    /// Only the owner of the session's shard delivers: elsewhere this is
    /// false (at once, on a service that holds no shard), and the owner
    /// delivers what the store holds.
    pub async fn deliver(self: &Arc<Self>, session_id: &SessionId) -> bool {
        if !self.terms.any_live() {
            return false;
        }
        self.deliver_to(None, session_id).await
    }

    /// [`Driver::deliver`] in `term`.
    pub(super) async fn deliver_in(self: &Arc<Self>, term: &Term, session_id: &SessionId) -> bool {
        self.deliver_to(Some(term), session_id).await
    }

    /// Delivers in `term`, or in the term of the session's shard (as its
    /// row, read once, says) if none is given and this service holds it.
    async fn deliver_to(self: &Arc<Self>, term: Option<&Term>, session_id: &SessionId) -> bool {
        let lock = self
            .delivering
            .lock()
            .expect("poisoned")
            .entry(session_id.to_owned())
            .or_default()
            .clone();
        let serial = lock.lock_owned().await;
        let recipient = match self.store.get_session(session_id).await {
            Ok(Some(row)) if row.status == troupe_proto::session::SessionStatus::Running => row,
            _ => return false,
        };
        let term = match term {
            Some(term) => term.clone(),
            None => match self.terms.of_workspace(&recipient.workspace_id) {
                Some(term) => term,
                None => return false,
            },
        };
        let pending = match self.inbox_for(&recipient).await {
            Ok(pending) => pending,
            Err(e) => {
                tracing::warn!(session = %session_id, error = %e, "cannot read the inbox");
                return false;
            }
        };
        let Some(last) = pending.last().map(|m| m.sequence) else {
            return true;
        };
        if !term.live() {
            return false;
        }
        let client = match self.session_runner(session_id).await {
            Ok(Some((_, client))) => client,
            _ => return false,
        };
        let written = client
            .clone()
            .write_stdin(WriteStdinRequest {
                exec_id: session_id.to_string(),
                frames: frames(&pending),
                ..Default::default()
            })
            .await;
        let received = match written {
            Ok(answer) => answer.into_inner().stdin_sequence,
            Err(status) => {
                tracing::debug!(session = %session_id, %status, "message not delivered yet");
                return false;
            }
        };
        if received < last {
            // Only a runner that ignores frames answers so.
            tracing::warn!(
                session = %session_id,
                received,
                last,
                "the runner did not take the messages as frames"
            );
            return false;
        }
        let driver = self.clone();
        let session_id = session_id.to_owned();
        let term = term.clone();
        tokio::spawn(async move {
            let marked = driver
                .store
                .mark_delivered(term.fence(), &session_id, received)
                .await;
            match term.check(marked) {
                Ok(()) => crate::metrics::delivered(pending.len()),
                Err(e) => {
                    tracing::warn!(session = %session_id, error = %e, "cannot record a delivery")
                }
            }
            drop(serial);
        });
        true
    }
}

/// The stdin frames of `messages`: each its line, numbered by its sequence.
pub(super) fn frames(messages: &[MessageLine]) -> Vec<StdinFrame> {
    messages
        .iter()
        .map(|m| StdinFrame {
            sequence: m.sequence,
            data: m.to_line(),
        })
        .collect()
}
