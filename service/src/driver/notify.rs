//! Notices of a session's end: the CALLBACK message to its parent, and the
//! failing of a session whose agent is lost or could not start.
//!
//! A callback is durable: the store makes it due in the transaction that
//! ends the child (an exit, a failure, a stop before any start) and clears
//! it in the one that writes the notice, so an owner that dies in between
//! leaves it to the next (`ProcessStore::driver_work`'s `callbacks_due`).

use std::sync::Arc;

use troupe_proto::agent::stdin::{SessionEnded, SessionEndedType};

use super::{Driver, Job, Term, system_audit};
use crate::{
    error::{Reason, SessionError},
    model::{
        Action, AuditRecord, EndReason, ExitReason, Failure, Finish, NewMessage, Principal,
        ProcessRow, SessionId, SessionRow,
    },
    store::Store,
};

impl<S: Store> Driver<S> {
    /// CALLBACK mode: tells the parent that the session has ended, if its
    /// notice is due; once at a time per session.
    pub(super) async fn callback(self: &Arc<Self>, term: &Term, session_id: &SessionId) {
        if !self.claim(Job::Callback, session_id) {
            return;
        }
        if let Err(e) = self.callback_now(term, session_id).await {
            tracing::warn!(session = %session_id, error = %e, "callback not written yet");
        }
        self.release(Job::Callback, session_id);
    }

    async fn callback_now(
        self: &Arc<Self>,
        term: &Term,
        session_id: &SessionId,
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
        let finished = self.store.finished(session_id).await?;
        let message = NewMessage {
            message_id: format!("msg_{}", uuid::Uuid::now_v7().simple()),
            sender: Principal::Troupe,
            body: notice(&row, &process, finished),
        };
        let audit = system_audit(
            Action::Callback,
            &parent,
            true,
            &format!("{session_id} ended"),
        );
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
        session_id: &SessionId,
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
                tracing::error!(session = %session_id, error = %e, "cannot record a lost agent")
            }
        }
    }

    /// Fails a session whose runner's lease lapsed (`runner_lost`); its
    /// audit entry gives the reason `RUNNER_LOST`.
    pub(super) async fn lose(self: &Arc<Self>, term: &Term, session_id: &SessionId) {
        let runner = match self.store.process(session_id).await {
            Ok(process) => process.and_then(|p| p.runner),
            Err(_) => return,
        };
        let runner = runner.map_or_else(|| "?".to_owned(), |r| r.to_string());
        let detail = format!("its runner {runner} stopped renewing its registration");
        let mut audit = system_audit(Action::RunnerLost, session_id, true, &detail);
        audit.reason = Reason::RunnerLost.as_str().to_owned();
        tracing::warn!(session = %session_id, %runner, "runner lost: failing the session");
        self.fail(term, session_id, Failure::RunnerLost, &detail, audit)
            .await;
    }

    /// A session that ended before its agent started: its parent (CALLBACK
    /// mode) is told, as it would be of an exit.
    pub(super) async fn ended_unstarted(self: &Arc<Self>, term: &Term, session_id: &SessionId) {
        let marked = self
            .store
            .mark_stopped(term.fence(), session_id, true)
            .await;
        match term.check(marked) {
            Ok(()) => self.callback(term, session_id).await,
            Err(e) => tracing::warn!(session = %session_id, error = %e, "cannot record a stop"),
        }
    }
}

/// The notice of `row`'s end, from what the store holds of it: its own
/// result if it finished its task, else the exit the runner reported, else
/// the failure that ended it (code -1), else that it never started.
fn notice(row: &SessionRow, process: &ProcessRow, finished: Option<Finish>) -> String {
    let reason = match &finished {
        Some(_) => Finish::END_REASON,
        None => {
            let ended = match row.end_reason {
                Some(EndReason::Exit(reason)) => reason,
                _ => ExitReason::NotStarted,
            };
            process.exit_reason.unwrap_or(ended).as_str()
        }
    };
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
        outcome: finished.as_ref().map(|f| f.outcome.as_str().to_owned()),
        output_tail: tail,
        reason: reason.to_owned(),
        result: finished.map(|f| f.result),
        session_id: row.session_id.to_string(),
        status: troupe_proto::status::status_str(row.status).to_owned(),
        kind: SessionEndedType::SessionEnded,
    }
    .to_text()
}
