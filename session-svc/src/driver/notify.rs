//! Notices of a session's end: the CALLBACK message to its parent, and the
//! failing of a session whose agent is lost or could not start.
//!
//! A callback is durable: the store makes it due in the transaction that
//! ends the child (an exit, a failure, a stop before any start) and clears
//! it in the one that writes the notice, so an owner that dies in between
//! leaves it to the next (`Store::driver_work`'s `callbacks_due`).

use std::sync::Arc;

use troupe_proto::agent::stdin::{SessionEnded, SessionEndedType};

use super::{Driver, Job, Term, system_audit};
use crate::{
    error::SessionError,
    model::{AuditRecord, ExitReason, Failure, NewMessage, Principal, ProcessRow, SessionRow},
    store::Store,
};

impl<S: Store> Driver<S> {
    /// CALLBACK mode: tells the parent that the session has ended, if its
    /// notice is due; once at a time per session.
    pub(super) async fn callback(self: &Arc<Self>, term: &Term, session_id: &str) {
        if !self.claim(Job::Callback, session_id) {
            return;
        }
        if let Err(e) = self.callback_now(term, session_id).await {
            tracing::warn!(session = session_id, error = %e, "callback not written yet");
        }
        self.release(Job::Callback, session_id);
    }

    async fn callback_now(
        self: &Arc<Self>,
        term: &Term,
        session_id: &str,
    ) -> Result<(), SessionError> {
        let (Some(process), Some(row)) = (
            self.store.process(session_id).await?,
            self.store.get_session(session_id).await?,
        ) else {
            return Ok(());
        };
        let Some(parent) = row.parent_session_id.clone() else {
            return Ok(());
        };
        if !process.callback_due {
            return Ok(());
        }
        let message = NewMessage {
            message_id: format!("msg_{}", uuid::Uuid::now_v7().simple()),
            sender: Principal::Troupe,
            body: notice(&row, &process),
        };
        let audit = system_audit("callback", &parent, true, &format!("{session_id} ended"));
        let sent = term.check(
            self.store
                .write_callback(term.fence(), session_id, message, audit)
                .await,
        )?;
        if sent.is_some() {
            self.deliver_in(term, &parent).await;
        }
        Ok(())
    }

    /// Fails a session whose agent is lost or could not start; its parent
    /// (CALLBACK mode) is then told as of an exit.
    pub(super) async fn fail(
        self: &Arc<Self>,
        term: &Term,
        session_id: &str,
        failure: Failure,
        detail: &str,
        audit: AuditRecord,
    ) {
        let failed = self
            .store
            .fail_session(term.fence(), session_id, failure, detail, audit)
            .await;
        match term.check(failed) {
            Ok(true) => self.callback(term, session_id).await,
            Ok(false) => {}
            Err(e) => {
                tracing::error!(session = session_id, error = %e, "cannot record a lost agent")
            }
        }
    }

    /// A session that ended before its agent started: its parent (CALLBACK
    /// mode) is told, as it would be of an exit.
    pub(super) async fn ended_unstarted(self: &Arc<Self>, term: &Term, session_id: &str) {
        let marked = self
            .store
            .mark_stopped(term.fence(), session_id, true)
            .await;
        match term.check(marked) {
            Ok(()) => self.callback(term, session_id).await,
            Err(e) => tracing::warn!(session = session_id, error = %e, "cannot record a stop"),
        }
    }
}

/// The notice of `row`'s end, from what the store holds of it: the exit
/// the runner reported, else the failure that ended it (code -1), else
/// that it never started.
fn notice(row: &SessionRow, process: &ProcessRow) -> String {
    let reason = process.exit_reason.unwrap_or_else(|| {
        row.end_reason
            .as_deref()
            .and_then(ExitReason::parse)
            .unwrap_or(ExitReason::NotStarted)
    });
    let tail = String::from_utf8_lossy(&process.output_tail);
    let tail: String = tail
        .chars()
        .rev()
        .take(2000)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    SessionEnded {
        exit_code: process.exit_code.unwrap_or(-1),
        output_tail: tail,
        reason: reason.as_str().to_owned(),
        session_id: row.session_id.clone(),
        status: troupe_proto::status::status_str(row.status).to_owned(),
        kind: SessionEndedType::SessionEnded,
    }
    .to_text()
}
