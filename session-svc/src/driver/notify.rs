//! Notices of a session's end: the CALLBACK message to its parent, and the
//! failing of a session whose agent is lost or could not start.

use std::sync::Arc;

use troupe_proto::agent::stdin::{SessionEnded, SessionEndedType};

use super::{Driver, system_audit};
use crate::{
    error::SessionError,
    model::{AuditRecord, ExitReason, Failure, Idempotency, NewMessage, Principal, ProcessExit},
    store::Store,
};

impl<S: Store> Driver<S> {
    /// CALLBACK mode: tells the parent that the session has ended.
    pub(super) async fn callback(self: &Arc<Self>, session_id: &str, exit: &ProcessExit) {
        let Ok(Some(process)) = self.store.process(session_id).await else {
            return;
        };
        let Ok(Some(row)) = self.store.get_session(session_id).await else {
            return;
        };
        let Some(parent) = row.parent_session_id.clone() else {
            return;
        };
        if !process.notify_parent {
            return;
        }
        let tail = String::from_utf8_lossy(&process.output_tail);
        let tail: String = tail
            .chars()
            .rev()
            .take(2000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let body = SessionEnded {
            exit_code: exit.code,
            output_tail: tail,
            reason: exit.reason.as_str().to_owned(),
            session_id: session_id.to_owned(),
            status: troupe_proto::status::status_str(row.status).to_owned(),
            kind: SessionEndedType::SessionEnded,
        }
        .to_text();
        let message = NewMessage {
            message_id: format!("msg_{}", uuid::Uuid::now_v7().simple()),
            sender: Principal::Troupe,
            body,
        };
        let audit = system_audit("callback", &parent, true, &format!("{session_id} ended"));
        // One notice per child, however many ends are reported for it (an
        // exit after a termination, a start given up): the first stands.
        let once = Idempotency {
            caller: Principal::Troupe,
            action: "callback",
            request_id: session_id.to_owned(),
            payload_hash: session_id.to_owned(),
        };
        let sent = self
            .store
            .send_message(&parent, message, Some(once), audit, &|target| {
                if target.is_active() {
                    Ok(())
                } else {
                    Err(SessionError::not_found(&target.session_id))
                }
            })
            .await;
        match sent {
            Ok(sent) if !sent.replayed => {
                self.deliver(&parent).await;
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(parent = %parent, error = %e, "no callback: parent gone"),
        }
    }

    /// Fails a session whose agent is lost or could not start, and tells
    /// its parent (CALLBACK mode) as an exit would.
    pub(super) async fn fail(
        self: &Arc<Self>,
        session_id: &str,
        failure: Failure,
        detail: &str,
        audit: AuditRecord,
    ) {
        match self
            .store
            .fail_session(session_id, failure, detail, audit)
            .await
        {
            Ok(true) => {
                self.callback(session_id, &failure.exit(detail)).await;
            }
            Ok(false) => {}
            Err(e) => {
                tracing::error!(session = session_id, error = %e, "cannot record a lost agent")
            }
        }
    }

    /// A session that ended before its agent started: its parent (CALLBACK
    /// mode) is told, as it would be of an exit.
    pub(super) async fn ended_unstarted(self: &Arc<Self>, session_id: &str) {
        let exit = ProcessExit {
            code: -1,
            reason: ExitReason::NotStarted,
            detail: "the session ended before its agent started".to_owned(),
        };
        self.callback(session_id, &exit).await;
    }
}
