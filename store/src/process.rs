//! What a session's runner reports of its process, applied once per event,
//! written once for both backends (see `backends`): `runner_seq` orders a
//! session's events and makes a repeated one a no-op; a step of
//! `policy::process_step` says what the event does to the session (starts
//! it, ends it) and which event it writes; output goes through its own
//! budgets (`record_output`); an end reaches the children by their
//! policies and makes the parent's callback due. Fenced by the lease of
//! the background work, as is a delivery (the inbox's messages that reached
//! the agent's stdin); a progress report is the session's own.

use super::backends::each_backend;

each_backend! {
    use crate::{
        error::SessionError,
        model::{
            AuditRecord, EventDetail, EventKind, Principal, ProcessChange, ProgressReport,
            SessionId, SessionRow, now_ms,
        },
        policy,
        {
            Fence, MessageCheck,
            journal::NewEvent,
            shared::{delivered_detail, event_detail},
        },
    };

    impl This {
        /// `Store::record_process`, one attempt; also says whether the
        /// event ended the session.
        pub(crate) async fn record_process_once(
            &self,
            fence: &Fence,
            session_id: &SessionId,
            runner_seq: u64,
            change: &ProcessChange,
            tail_max: usize,
        ) -> Result<Option<SessionRow>, SessionError> {
            let mut tx = self.tx().await?;
            This::check_fence(tx.conn(), fence).await?;
            let row = tx.lock_process(session_id, change).await?;
            // A gap's first event: the one after the last applied.
            let gap_from = match change {
                ProcessChange::Truncated { .. } => {
                    let last: Option<i64> =
                        sqlx::query_scalar("SELECT runner_seq FROM processes WHERE session_id = $1")
                            .bind(session_id)
                            .fetch_optional(tx.conn())
                            .await?;
                    last.unwrap_or(0) as u64 + 1
                }
                _ => 0,
            };
            let applied: Option<i64> = sqlx::query_scalar(
                "INSERT INTO processes (session_id, runner_seq) VALUES ($1, $2) \
                 ON CONFLICT (session_id) DO UPDATE SET runner_seq = $2 \
                 WHERE processes.runner_seq < $2 RETURNING runner_seq",
            )
            .bind(session_id)
            .bind(runner_seq as i64)
            .fetch_optional(tx.conn())
            .await?;
            if applied.is_none() {
                return Ok(None);
            }
            let step = policy::process_step(row.status, change);
            let status = step.status.unwrap_or(row.status);
            if let ProcessChange::Exited(exit) = change {
                sqlx::query(
                    "UPDATE processes SET exit_code = $1, exit_reason = $2, \
                     callback_due = notify_parent WHERE session_id = $3",
                )
                .bind(exit.code)
                .bind(exit.reason.as_str())
                .bind(session_id)
                .execute(tx.conn())
                .await?;
            }
            let changed = match (step.status, &step.end_reason) {
                (Some(status), Some(reason)) => tx
                    .end_sessions(std::slice::from_ref(session_id), status, session_id, reason, reason)
                    .await?
                    .pop(),
                (Some(status), None) => Some(tx.set_status(session_id, status).await?),
                (None, _) => None,
            };
            let ended = step.end_reason.is_some() && changed.is_some();
            let mut events = Vec::new();
            match (step.event, change) {
                (Some(EventKind::Output), ProcessChange::Output { stream, data }) => {
                    let budget = self.output_budget;
                    This::record_output(tx.conn(), session_id, stream, status, data, tail_max, budget)
                        .await?;
                }
                (Some(kind), change) => events.push(NewEvent::new(
                    session_id,
                    kind,
                    status,
                    &event_detail(change, runner_seq, gap_from),
                )),
                (None, _) => {}
            }
            // Its end reaches its children by their policies.
            if let (true, Some(own)) = (ended, &changed) {
                events.extend(tx.reach_children(own, &Principal::Troupe).await?.events);
            }
            if step.event != Some(EventKind::Output) {
                // Written even when empty: watchers look (an exit code that
                // landed after the session ended).
                This::append_events(tx.conn(), &events, ended).await?;
            }
            tx.commit().await?;
            self.committed(ended);
            Ok(Some(changed.unwrap_or(row)))
        }

        /// `Store::mark_delivered`, one attempt: the inbox's messages up to
        /// `seq` reached the agent; one `delivered` event if it advanced.
        pub(crate) async fn mark_delivered_once(
            &self,
            fence: &Fence,
            session_id: &str,
            seq: u64,
        ) -> Result<(), SessionError> {
            let mut tx = self.tx().await?;
            This::check_fence(tx.conn(), fence).await?;
            let row = tx.lock_row(session_id).await?;
            let advanced = sqlx::query(
                "UPDATE processes SET delivered_seq = $1 \
                 WHERE session_id = $2 AND delivered_seq < $1",
            )
            .bind(seq as i64)
            .bind(session_id)
            .execute(tx.conn())
            .await?
            .rows_affected()
                > 0;
            // The inbox's unread bytes less those delivered now, then the entries.
            sqlx::query(
                "UPDATE sessions SET unread_bytes = unread_bytes - ( \
                   SELECT COALESCE(SUM(bytes), 0) FROM messages \
                   WHERE session_id = $1 AND seq <= $2 AND delivered_at_ms IS NULL) \
                 WHERE session_id = $1",
            )
            .bind(session_id)
            .bind(seq as i64)
            .execute(tx.conn())
            .await?;
            sqlx::query(
                "UPDATE messages SET delivered_at_ms = $1 \
                 WHERE session_id = $2 AND seq <= $3 AND delivered_at_ms IS NULL",
            )
            .bind(now_ms())
            .bind(session_id)
            .bind(seq as i64)
            .execute(tx.conn())
            .await?;
            // One event per delivery that advanced, however many messages.
            if advanced {
                let detail = delivered_detail(seq);
                let event = NewEvent::new(session_id, EventKind::Delivered, row.status, &detail);
                This::append_events(tx.conn(), &[event], false).await?;
            }
            tx.commit().await?;
            if advanced {
                self.committed(false);
            }
            Ok(())
        }

        /// `Store::record_progress`, one attempt: the event, the session's
        /// last report, the audit entry; returns the event's sequence.
        pub(crate) async fn record_progress_once(
            &self,
            session_id: &str,
            report: &ProgressReport,
            audit: &AuditRecord,
            check: MessageCheck<'_>,
        ) -> Result<u64, SessionError> {
            let mut tx = self.tx().await?;
            let row = tx.lock_row(session_id).await?;
            check(&row)?;
            let detail = EventDetail::Progress(report.clone());
            sqlx::query("UPDATE sessions SET last_progress = $2 WHERE session_id = $1")
                .bind(session_id)
                .bind(detail.to_json())
                .execute(tx.conn())
                .await?;
            This::insert_audit(tx.conn(), audit).await?;
            let event = NewEvent::new(session_id, EventKind::Progress, row.status, &detail);
            let seqs = This::append_events(tx.conn(), &[event], false).await?;
            tx.commit().await?;
            self.committed(false);
            Ok(seqs.first().map_or(0, |seq| *seq as u64))
        }

        /// `Store::mark_stopped`, one attempt: the process was asked to stop;
        /// one that never started (`unstarted`, nothing reported) makes its
        /// parent's callback due.
        pub(crate) async fn mark_stopped_once(
            &self,
            fence: &Fence,
            session_id: &str,
            unstarted: bool,
        ) -> Result<(), SessionError> {
            let mut tx = self.tx().await?;
            This::check_fence(tx.conn(), fence).await?;
            sqlx::query(
                "INSERT INTO processes (session_id, notify_parent, stopped, callback_due) \
                 SELECT session_id, notify_parent, TRUE, notify_parent AND $2 \
                 FROM sessions WHERE session_id = $1 \
                 ON CONFLICT (session_id) DO UPDATE SET stopped = TRUE, \
                   callback_due = processes.callback_due \
                     OR ($2 AND processes.notify_parent AND processes.runner_seq = 0 \
                         AND processes.exit_code IS NULL)",
            )
            .bind(session_id)
            .bind(unstarted)
            .execute(tx.conn())
            .await?;
            tx.commit().await
        }
    }
}
