//! A session's end, written once for both backends (see `backends`): a
//! termination, its own end (`finish`), a failure its runner or owner
//! reports, a budget's. Each is one transaction: it takes the ended
//! session (`Tx::lock_session`: on PostgreSQL its workspace and tree first,
//! the lock order of `postgres::locks`; SQLite's writer holds everything),
//! ends the sessions, applies the end to the children by their policies
//! (`Tx::reach_children`), writes its audit entry, and its events last.
//! Ended rows reach SQLite's ledger at the commit.

use std::future::Future;

use super::{Fence, MessageCheck, TerminateCheck, backends::each_backend};
use crate::{
    error::SessionError,
    model::{AuditRecord, Failure, Finish, Principal, SessionId, SessionRow},
};

/// Ending sessions, and what an end leaves; every [`super::Store`] is one.
pub trait EndStore: Send + Sync {
    /// Ends `target` and every active descendant if `check` allows it.
    /// Returns the ids it ended (target first) and the target's new row.
    fn terminate(
        &self,
        target: &SessionId,
        terminated_by: &Principal,
        reason: &str,
        audit: AuditRecord,
        check: TerminateCheck<'_>,
    ) -> impl Future<Output = Result<(Vec<SessionId>, SessionRow), SessionError>> + Send;

    /// Ends `session_id` with its own result if `check` allows it (on the
    /// session as the store has it): status completed or failed as
    /// `finish.outcome` says, end reason `finished`, the result stored, its
    /// end event (with the result), its parent's callback made due (CALLBACK
    /// mode), its process to be stopped no sooner than `stop_after_ms` (ms
    /// since the Unix epoch), every active descendant terminated
    /// (`cascade`, by the session), and `audit`, in one transaction.
    /// Returns the descendants it ended and the session's new row.
    fn finish(
        &self,
        session_id: &SessionId,
        finish: &Finish,
        stop_after_ms: i64,
        audit: AuditRecord,
        check: MessageCheck<'_>,
    ) -> impl Future<Output = Result<(Vec<SessionId>, SessionRow), SessionError>> + Send;

    /// Returns a session's own result, if it finished its task.
    fn finished(
        &self,
        session_id: &SessionId,
    ) -> impl Future<Output = Result<Option<Finish>, SessionError>> + Send;

    /// Ends an active session as failed (its process is gone, or could not
    /// be made: `failure` says which) with an audit entry; false if it had
    /// already ended. Ending it makes the parent's callback due.
    fn fail_session(
        &self,
        fence: &Fence,
        session_id: &SessionId,
        failure: Failure,
        detail: &str,
        audit: AuditRecord,
    ) -> impl Future<Output = Result<bool, SessionError>> + Send;

    /// Ends `session_id` and every active descendant as terminated with
    /// end reason `budget` (by `troupe`), with `audit`, if it is still
    /// active; returns the ids it ended. Background work: fenced.
    fn end_for_budget(
        &self,
        fence: &Fence,
        session_id: &SessionId,
        audit: AuditRecord,
    ) -> impl Future<Output = Result<Vec<SessionId>, SessionError>> + Send;
}

each_backend! {
    use serde_json::json;
    use troupe_proto::session::SessionStatus;

    use crate::{
        error::SessionError,
        model::{SessionId, AuditRecord, EndReason, EventDetail, EventKind, Terminated, ExitReason, Failure, Finish, Principal, ProcessChange, SessionRow},
        policy,
        {Fence, MessageCheck, TerminateCheck, journal::NewEvent, shared::event_detail},
    };

    /// The `terminated` event of `session_id`, ended for `reason` by `by`.
    fn terminated(session_id: &str, reason: &EndReason, by: &Principal) -> NewEvent {
        NewEvent::new(
            session_id,
            EventKind::Terminated,
            SessionStatus::Terminated,
            &EventDetail::Terminated(Terminated {
                reason: reason.to_string(),
                terminated_by: by.to_string(),
                parent_ended: None,
            }),
        )
    }

    /// The ids of `rows`.
    fn ids(rows: &[SessionRow]) -> Vec<SessionId> {
        rows.iter().map(|r| r.session_id.clone()).collect()
    }

    impl EndStore for This {
        /// An active target ends and its
        /// end reaches its children by their policies; an ended one's active
        /// subtree (its orphans) is ended whole (`cascade`).
        async fn terminate(
            &self,
            target: &SessionId,
            terminated_by: &Principal,
            reason: &str,
            audit: AuditRecord,
            check: TerminateCheck<'_>,
        ) -> Result<(Vec<SessionId>, SessionRow), SessionError> {
            let (by, audit) = (terminated_by, &audit);
            retrying!(async {
                let mut tx = self.tx().await?;
                let row = tx.lock_session(target).await?;
                let ancestors = tx.ancestors(target).await?;
                check(&row, &ancestors)?;
                let subtree = if row.is_active() {
                    vec![target.clone()]
                } else {
                    tx.active_subtree(target).await?
                };
                let given = EndReason::Given(reason.to_owned());
                let cascade = EndReason::Cascade;
                let ended = tx
                    .end_sessions(&subtree, SessionStatus::Terminated, target, &given, &cascade)
                    .await?;
                let mut events: Vec<NewEvent> = ended
                    .iter()
                    .map(|r| {
                        let why = if r.session_id == *target { &given } else { &cascade };
                        terminated(&r.session_id, why, by)
                    })
                    .collect();
                let mut ended_ids = ids(&ended);
                let own = ended.iter().find(|r| r.session_id == *target);
                if let Some(own) = own {
                    let reached = tx.reach_children(own, by).await?;
                    ended_ids.extend(reached.applied.terminated);
                    events.extend(reached.events);
                }
                let mut audit = audit.clone();
                audit.detail = json!({"terminated": ended_ids}).to_string();
                This::insert_audit(tx.conn(), &audit).await?;
                This::append_events(tx.conn(), &events, !ended_ids.is_empty()).await?;
                tx.commit().await?;
                self.committed(!ended_ids.is_empty());
                Ok((ended_ids, own.cloned().unwrap_or(row)))
            })
        }

        async fn finish(
            &self,
            session_id: &SessionId,
            finish: &Finish,
            stop_after_ms: i64,
            audit: AuditRecord,
            check: MessageCheck<'_>,
        ) -> Result<(Vec<SessionId>, SessionRow), SessionError> {
            let audit = &audit;
            retrying!(async {
                let mut tx = self.tx().await?;
                let row = tx.lock_session(session_id).await?;
                check(&row)?;
                let status = finish.outcome.status();
                let own = tx
                    .end_sessions(
                        std::slice::from_ref(session_id),
                        status,
                        session_id,
                        &EndReason::Finished,
                        &EndReason::Finished,
                    )
                    .await?
                    .pop();
                sqlx::query("UPDATE sessions SET outcome = $2, result = $3 WHERE session_id = $1")
                    .bind(session_id)
                    .bind(finish.outcome.as_str())
                    .bind(&finish.result)
                    .execute(tx.conn())
                    .await?;
                // The parent hears of the end now, with the result; the exit that
                // follows finds the notice written (its guard) and adds none.
                sqlx::query(
                    "UPDATE processes SET callback_due = notify_parent, stop_after_ms = $2 \
                     WHERE session_id = $1",
                )
                .bind(session_id)
                .bind(stop_after_ms)
                .execute(tx.conn())
                .await?;
                let kind = match status {
                    SessionStatus::Completed => EventKind::Completed,
                    _ => EventKind::Failed,
                };
                let mut events = vec![NewEvent::new(session_id, kind, status, &finish.event_detail())];
                let mut terminated = Vec::new();
                if let Some(own) = &own {
                    let by = Principal::Session(session_id.clone());
                    let reached = tx.reach_children(own, &by).await?;
                    terminated = reached.applied.terminated;
                    events.extend(reached.events);
                }
                let mut audit = audit.clone();
                audit.detail = json!({"outcome": finish.outcome.as_str(),
                                      "result_bytes": finish.result.len(),
                                      "terminated": terminated})
                .to_string();
                This::insert_audit(tx.conn(), &audit).await?;
                This::append_events(tx.conn(), &events, true).await?;
                tx.commit().await?;
                self.committed(true);
                Ok((terminated, own.unwrap_or(row)))
            })
        }

        /// `EndStore::finished`.
        async fn finished(
            &self,
            session_id: &SessionId,
        ) -> Result<Option<Finish>, SessionError> {
            let stored: Option<(Option<String>, Option<String>)> =
                sqlx::query_as("SELECT outcome, result FROM sessions WHERE session_id = $1")
                    .bind(session_id)
                    .fetch_optional(&self.pool)
                    .await?;
            match stored {
                Some((outcome, result)) => Finish::stored(outcome, result),
                None => Ok(None),
            }
        }

        /// A failure is an exit with its
        /// reason, which ends only an active session.
        async fn fail_session(
            &self,
            fence: &Fence,
            session_id: &SessionId,
            failure: Failure,
            detail: &str,
            audit: AuditRecord,
        ) -> Result<bool, SessionError> {
            let audit = &audit;
            retrying!(async {
                let mut tx = self.tx().await?;
                This::check_fence(tx.conn(), fence).await?;
                let row = tx.lock_session(session_id).await?;
                let exit = ProcessChange::Exited(failure.exit(detail));
                let step = policy::process_step(row.status, &exit);
                let own = match (step.status, &step.end_reason) {
                    (Some(status), Some(reason)) => tx
                        .end_sessions(std::slice::from_ref(session_id), status, session_id, reason, reason)
                        .await?
                        .pop(),
                    _ => None,
                };
                if own.is_some() {
                    // Its parent's notice is owed from this commit on.
                    sqlx::query(
                        "INSERT INTO processes (session_id, notify_parent, callback_due) \
                         SELECT session_id, notify_parent, notify_parent FROM sessions \
                         WHERE session_id = $1 \
                         ON CONFLICT (session_id) DO UPDATE SET callback_due = processes.notify_parent",
                    )
                    .bind(session_id)
                    .execute(tx.conn())
                    .await?;
                }
                This::insert_audit(tx.conn(), audit).await?;
                let mut events = Vec::new();
                if let Some(own) = &own {
                    if let Some(kind) = step.event {
                        events.push(NewEvent::new(session_id, kind, own.status, &event_detail(&exit, 0, 0)));
                    }
                    events.extend(tx.reach_children(own, &Principal::Troupe).await?.events);
                    This::append_events(tx.conn(), &events, true).await?;
                }
                tx.commit().await?;
                self.committed(own.is_some());
                Ok(own.is_some())
            })
        }

        async fn end_for_budget(
            &self,
            fence: &Fence,
            session_id: &SessionId,
            audit: AuditRecord,
        ) -> Result<Vec<SessionId>, SessionError> {
            let audit = &audit;
            retrying!(async {
                let mut tx = self.tx().await?;
                This::check_fence(tx.conn(), fence).await?;
                if !tx.lock_session(session_id).await?.is_active() {
                    return Ok(Vec::new());
                }
                let subtree = tx.active_subtree(session_id).await?;
                let reason = EndReason::Exit(ExitReason::Budget);
                let ended = tx
                    .end_sessions(&subtree, SessionStatus::Terminated, session_id, &reason, &reason)
                    .await?;
                let ended = ids(&ended);
                let mut audit = audit.clone();
                audit.detail = json!({"terminated": ended}).to_string();
                This::insert_audit(tx.conn(), &audit).await?;
                let events: Vec<NewEvent> = ended
                    .iter()
                    .map(|id| terminated(id, &reason, &Principal::Troupe))
                    .collect();
                This::append_events(tx.conn(), &events, !ended.is_empty()).await?;
                tx.commit().await?;
                self.committed(!ended.is_empty());
                Ok(ended)
            })
        }
    }
}
