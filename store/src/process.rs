//! What a session's runner reports of its process, applied once per event
//! (output also a run of events in one write, `record_outputs`), written
//! once for both backends (see `backends`): `runner_seq` orders a
//! session's events and makes a repeated one a no-op; a step of
//! `policy::process_step` says what the event does to the session (starts
//! it, ends it) and which event it writes; output goes through its own
//! budgets (`record_output`); an end reaches the children by their
//! policies and makes the parent's callback due. Fenced by the lease of
//! the background work, as is a delivery (the inbox's messages that reached
//! the agent's stdin); a progress report is the session's own.

use std::future::Future;

use super::{Fence, MessageCheck, backends::each_backend};
use crate::{
    error::{SessionError, parse_stored},
    model::{
        AuditRecord, ExitReason, OutputChunk, ProcessChange, ProcessRow, ProgressReport,
        RunnerName, SessionId, SessionRow,
    },
    shard::{Shard, ShardSet},
};

/// The work the owners of the shards find in the store, whoever recorded
/// it: what any service's calls left for the driver. Each session named
/// with its shard, whose owner does it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DriverWork {
    /// Pending sessions whose agent was never asked for (no process row).
    pub unstarted: Vec<crate::model::SessionRow>,
    /// Running sessions with messages not yet written to their agent.
    pub undelivered: Vec<(Shard, SessionId)>,
    /// Ended sessions whose process has reported no exit (to be stopped).
    pub unstopped: Vec<(Shard, SessionId)>,
    /// Ended sessions whose parent is owed its callback notice.
    pub callbacks_due: Vec<(Shard, SessionId)>,
    /// Active sessions with a process on a runner whose lease lapsed (or
    /// that is gone), deepest first: they fail `runner_lost`.
    pub runner_lost: Vec<(Shard, SessionId)>,
}

/// Sessions named with their shards, as a query reads them (`shard`,
/// `session_id`); a row of no shard yet (-1, written by an older release)
/// is left until it has one.
pub(crate) fn in_shards(rows: Vec<(i32, SessionId)>) -> Vec<(Shard, SessionId)> {
    rows.into_iter()
        .filter_map(|(shard, id)| Some((Shard::new(u16::try_from(shard).ok()?)?, id)))
        .collect()
}

/// Sessions' processes as their runners report them, and what the driver finds to do; every [`super::Store`] is one.
pub trait ProcessStore: Send + Sync {
    /// Applies runner event `runner_seq` of a session's process, once: the
    /// status it implies (pending to running, running to completed or
    /// failed), its event, the output tail (its last `tail_max` bytes, every
    /// byte as printed), the exit. Output events are kept within the
    /// store's byte budgets (see [`crate::OutputBudget`]). Returns the session after it, or `None` if it was applied before.
    /// Wakes the subscribers even when it wrote no event (an exit after a
    /// termination), so a waiter sees the exit code land. An exit makes the
    /// parent's callback due (CALLBACK mode) in the same transaction.
    fn record_process(
        &self,
        fence: &Fence,
        session_id: &SessionId,
        runner_seq: u64,
        change: ProcessChange,
        tail_max: usize,
    ) -> impl Future<Output = Result<Option<SessionRow>, SessionError>> + Send;

    /// Applies a run of output events of a session's process at once, in
    /// one transaction, as [`ProcessStore::record_process`] applies each:
    /// the chunks in rising `runner_seq` order (a run out of order is an
    /// internal error, and writes nothing), those applied before skipped.
    /// Returns how many were applied now: always the run's last ones.
    fn record_outputs(
        &self,
        fence: &Fence,
        session_id: &SessionId,
        chunks: &[OutputChunk],
        tail_max: usize,
    ) -> impl Future<Output = Result<usize, SessionError>> + Send;

    /// Returns a session's process record.
    fn process(
        &self,
        session_id: &SessionId,
    ) -> impl Future<Output = Result<Option<ProcessRow>, SessionError>> + Send;

    /// Records that messages up to `seq` were written to the agent.
    fn mark_delivered(
        &self,
        fence: &Fence,
        session_id: &SessionId,
        seq: u64,
    ) -> impl Future<Output = Result<(), SessionError>> + Send;

    /// Records that a session's process was asked to stop (or never
    /// started, `unstarted`: then its parent's callback becomes due).
    fn mark_stopped(
        &self,
        fence: &Fence,
        session_id: &SessionId,
        unstarted: bool,
    ) -> impl Future<Output = Result<(), SessionError>> + Send;

    /// Appends a progress event to an active session's events, with its
    /// audit entry; returns the event's sequence. `check` decides on the
    /// session as the ledger has it, under the writer lock.
    fn record_progress(
        &self,
        session_id: &SessionId,
        report: ProgressReport,
        audit: AuditRecord,
        check: MessageCheck<'_>,
    ) -> impl Future<Output = Result<u64, SessionError>> + Send;

    /// Returns what the store holds for the background work of `shards` to
    /// do, whoever recorded it (see [`DriverWork`]).
    fn driver_work(
        &self,
        shards: ShardSet,
    ) -> impl Future<Output = Result<DriverWork, SessionError>> + Send;
}

each_backend! {
    use sqlx::Row;

    use crate::{
        error::SessionError,
        model::{
            AuditRecord, EventDetail, EventKind, OutputChunk, Principal, ProcessChange,
            ProgressReport, SessionId, SessionRow, now_ms,
        },
        policy,
        shard::ShardSet,
        {
            Fence, MessageCheck,
            journal::NewEvent,
            shared::{delivered_detail, event_detail},
        },
    };

    impl ProcessStore for This {
        async fn record_process(
            &self,
            fence: &Fence,
            session_id: &SessionId,
            runner_seq: u64,
            change: ProcessChange,
            tail_max: usize,
        ) -> Result<Option<SessionRow>, SessionError> {
            let change = &change;
            retrying!(async {
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
                        let chunk = OutputChunk { runner_seq, stream, data: data.clone() };
                        let budget = self.output_budget;
                        This::record_output(tx.conn(), session_id, status, &[chunk], tail_max, budget)
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
                if step.event == Some(EventKind::Output) {
                    // Written by `record_output`.
                } else if events.is_empty() {
                    // An exit code that landed after the session ended may
                    // leave a callback due: its shard's driver looks.
                    This::touch(tx.conn(), session_id).await?;
                } else {
                    This::append_events(tx.conn(), &events, ended).await?;
                }
                tx.commit().await?;
                self.committed(ended);
                Ok(Some(changed.unwrap_or(row)))
            })
        }

        async fn record_outputs(
            &self,
            fence: &Fence,
            session_id: &SessionId,
            chunks: &[OutputChunk],
            tail_max: usize,
        ) -> Result<usize, SessionError> {
            if !chunks.windows(2).all(|w| w[0].runner_seq < w[1].runner_seq) {
                return Err(SessionError::Internal(
                    "a run of output out of runner order".to_owned(),
                ));
            }
            retrying!(async {
                let mut tx = self.tx().await?;
                This::check_fence(tx.conn(), fence).await?;
                let row = tx.lock_output(session_id).await?;
                let last: Option<i64> =
                    sqlx::query_scalar("SELECT runner_seq FROM processes WHERE session_id = $1")
                        .bind(session_id)
                        .fetch_optional(tx.conn())
                        .await?;
                let last = last.unwrap_or(0) as u64;
                let fresh = &chunks[chunks.partition_point(|c| c.runner_seq <= last)..];
                let Some(newest) = fresh.last() else {
                    return Ok(0);
                };
                sqlx::query(
                    "INSERT INTO processes (session_id, runner_seq) VALUES ($1, $2) \
                     ON CONFLICT (session_id) DO UPDATE SET runner_seq = $2 \
                     WHERE processes.runner_seq < $2",
                )
                .bind(session_id)
                .bind(newest.runner_seq as i64)
                .execute(tx.conn())
                .await?;
                let budget = self.output_budget;
                This::record_output(tx.conn(), session_id, row.status, fresh, tail_max, budget)
                    .await?;
                tx.commit().await?;
                self.committed(false);
                Ok(fresh.len())
            })
        }

        /// A session's process record.
        async fn process(
            &self,
            session_id: &SessionId,
        ) -> Result<Option<ProcessRow>, SessionError> {
            let row = sqlx::query(
                "SELECT runner_seq, exit_code, exit_reason, output_tail, delivered_seq, \
                 notify_parent, callback_due, runner, stop_after_ms \
                 FROM processes WHERE session_id = $1",
            )
            .bind(session_id)
            .fetch_optional(&self.pool)
            .await?;
            row.map(|row| {
                let exit_reason: Option<String> = row.try_get("exit_reason")?;
                Ok(ProcessRow {
                    runner_seq: row.try_get::<i64, _>("runner_seq")? as u64,
                    exit_code: row.try_get("exit_code")?,
                    exit_reason: exit_reason
                        .map(|r| parse_stored("exit reason", &r, ExitReason::parse))
                        .transpose()?,
                    output_tail: row.try_get("output_tail")?,
                    delivered_seq: row.try_get::<i64, _>("delivered_seq")? as u64,
                    notify_parent: row.try_get("notify_parent")?,
                    callback_due: row.try_get("callback_due")?,
                    stop_after_ms: row.try_get("stop_after_ms")?,
                    runner: row
                        .try_get::<Option<String>, _>("runner")?
                        .map(RunnerName::stored),
                })
            })
            .transpose()
        }

        /// The inbox's messages up to
        /// `seq` reached the agent; one `delivered` event if it advanced.
        async fn mark_delivered(
            &self,
            fence: &Fence,
            session_id: &SessionId,
            seq: u64,
        ) -> Result<(), SessionError> {
            retrying!(async {
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
            })
        }

        /// The process was asked to stop;
        /// one that never started (`unstarted`, nothing reported) makes its
        /// parent's callback due.
        async fn mark_stopped(
            &self,
            fence: &Fence,
            session_id: &SessionId,
            unstarted: bool,
        ) -> Result<(), SessionError> {
            retrying!(async {
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
            })
        }

        /// The event, the session's
        /// last report, the audit entry; returns the event's sequence.
        async fn record_progress(
            &self,
            session_id: &SessionId,
            report: ProgressReport,
            audit: AuditRecord,
            check: MessageCheck<'_>,
        ) -> Result<u64, SessionError> {
            let (report, audit) = (&report, &audit);
            retrying!(async {
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
            })
        }

        /// `ProcessStore::driver_work`: what the calls of any service left for the
        /// driver, in `shards`.
        async fn driver_work(&self, shards: ShardSet) -> Result<DriverWork, SessionError> {
            let mut conn = self.pool.acquire().await?;
            let mask = shards.mask();
            let unstarted: Vec<SessionId> = sqlx::query_scalar(concat!(
                "SELECT session_id FROM sessions s WHERE status = 'pending' \
                 AND s.shard >= 0 AND (($1 >> s.shard) & 1) = 1 \
                 AND NOT EXISTS (SELECT 1 FROM processes p WHERE p.session_id = s.session_id) \
                 ORDER BY ",
                row_order!()
            ))
            .bind(mask)
            .fetch_all(&mut *conn)
            .await?;
            let undelivered = sqlx::query_as(concat!(
                "SELECT s.shard, s.session_id FROM sessions s JOIN processes p USING (session_id) \
                 WHERE s.status = 'running' AND s.inbox_seq > p.delivered_seq \
                 AND s.shard >= 0 AND (($1 >> s.shard) & 1) = 1 ORDER BY s.",
                row_order!()
            ))
            .bind(mask)
            .fetch_all(&mut *conn)
            .await?;
            // Ended sessions whose process may still run (no exit reported,
            // not yet asked to stop; a finished one's after its grace), and
            // CALLBACK-mode ones ended before any start.
            let unstopped = sqlx::query_as(concat!(
                "SELECT s.shard, s.session_id FROM sessions s LEFT JOIN processes p USING (session_id) \
                 WHERE s.status IN ('completed', 'failed', 'terminated') \
                 AND s.shard >= 0 AND (($1 >> s.shard) & 1) = 1 \
                 AND ((p.session_id IS NOT NULL AND p.exit_code IS NULL AND NOT p.stopped \
                       AND (p.stop_after_ms IS NULL OR p.stop_after_ms <= ",
                db_now_ms!(),
                ")) OR (p.session_id IS NULL AND s.notify_parent)) ORDER BY s.",
                row_order!()
            ))
            .bind(mask)
            .fetch_all(&mut *conn)
            .await?;
            let callbacks_due = sqlx::query_as(
                "SELECT s.shard, p.session_id FROM processes p JOIN sessions s USING (session_id) \
                 WHERE p.callback_due AND s.shard >= 0 AND (($1 >> s.shard) & 1) = 1",
            )
            .bind(mask)
            .fetch_all(&mut *conn)
            .await?;
            // Active sessions on a runner whose lease lapsed (or that is gone).
            let runner_lost = sqlx::query_as(concat!(
                "SELECT s.shard, s.session_id FROM sessions s JOIN processes p USING (session_id) \
                 LEFT JOIN runners r ON r.name = p.runner \
                 WHERE s.status IN ('pending', 'running') AND p.runner IS NOT NULL \
                 AND s.shard >= 0 AND (($1 >> s.shard) & 1) = 1 \
                 AND (r.name IS NULL OR r.lease_expires_ms <= ",
                db_now_ms!(),
                ") ORDER BY s.depth DESC, s.",
                row_order!()
            ))
            .bind(mask)
            .fetch_all(&mut *conn)
            .await?;
            Ok(DriverWork {
                runner_lost: super::in_shards(runner_lost),
                unstarted: self.rows_of(&mut conn, &unstarted).await?,
                undelivered: super::in_shards(undelivered),
                unstopped: super::in_shards(unstopped),
                callbacks_due: super::in_shards(callbacks_due),
            })
        }
    }
}
