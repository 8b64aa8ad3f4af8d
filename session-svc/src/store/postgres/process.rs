//! The process side: what each session's agent did, as the runner reported
//! it, which messages reached its stdin, the progress it reported, and its
//! failures. Each write is one transaction; one that may end a session
//! takes the workspace and tree locks first (see `locks`).

use troupe_proto::status::status_str;

use super::{
    PgStore,
    events::{self, NewEvent},
    lease, locks,
    open::{RawSession, session_columns},
    output, parent_end,
};
use crate::{
    error::SessionError,
    model::{AuditRecord, EventKind, Failure, Principal, ProcessChange, SessionRow, now_ms},
    policy,
    store::{
        Fence, MessageCheck,
        shared::{delivered_detail, event_detail},
    },
};

impl PgStore {
    /// Applies one runner event; returns the session after it (`None` if it
    /// was applied before) and whether it ended the session.
    pub(super) async fn record_process_once(
        &self,
        fence: &Fence,
        session_id: &str,
        runner_seq: u64,
        change: &ProcessChange,
        tail_max: usize,
    ) -> Result<(Option<SessionRow>, bool), SessionError> {
        let mut tx = self.begin().await?;
        lease::check(&mut tx, fence).await?;
        match change {
            // Output's `meta` row first (see `locks`).
            ProcessChange::Output { .. } => output::lock_total(&mut tx).await?,
            // An exit may end the session: its counters' rows first.
            ProcessChange::Exited(_) => locks::place_of(&mut tx, session_id).await?,
            _ => {}
        }
        let (row, _) = locks::session(&mut tx, session_id).await?;
        // A gap's first event: the one after the last applied.
        let gap_from = match change {
            ProcessChange::Truncated { .. } => {
                let last: Option<i64> =
                    sqlx::query_scalar("SELECT runner_seq FROM processes WHERE session_id = $1")
                        .bind(session_id)
                        .fetch_optional(&mut *tx)
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
        .fetch_optional(&mut *tx)
        .await?;
        if applied.is_none() {
            return Ok((None, false));
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
            .execute(&mut *tx)
            .await?;
        }
        let changed = match (step.status, &step.end_reason) {
            (Some(status), Some(reason)) => locks::end_sessions(
                &mut tx,
                &[session_id.to_owned()],
                status,
                session_id,
                reason,
                reason,
            )
            .await?
            .pop(),
            (Some(status), None) => {
                let raw: RawSession = sqlx::query_as(concat!(
                    "UPDATE sessions SET status = $2 WHERE session_id = $1 RETURNING ",
                    session_columns!()
                ))
                .bind(session_id)
                .bind(status_str(status))
                .fetch_one(&mut *tx)
                .await?;
                Some(raw.into_row()?)
            }
            (None, _) => None,
        };
        let ended = step.end_reason.is_some() && changed.is_some();
        // Its end reaches its children by their policies.
        let mut below = Vec::new();
        if let (true, Some(own)) = (ended, &changed) {
            below = parent_end::apply(&mut tx, own, &Principal::Troupe)
                .await?
                .events;
        }
        match (step.event, change) {
            // Nothing to write, but watchers look (an exit code that landed
            // after the session ended).
            (None, _) => {
                events::write(&mut tx, &below, ended).await?;
            }
            (Some(EventKind::Output), ProcessChange::Output { stream, data }) => {
                output::record(
                    &mut tx,
                    session_id,
                    stream,
                    status,
                    data,
                    tail_max,
                    self.output_budget,
                )
                .await?;
            }
            (Some(kind), change) => {
                let event = NewEvent::new(
                    session_id,
                    kind,
                    status,
                    event_detail(change, runner_seq, gap_from),
                );
                below.insert(0, event);
                events::write(&mut tx, &below, ended).await?;
            }
        }
        tx.commit().await?;
        Ok((Some(changed.unwrap_or(row)), ended))
    }

    pub(super) async fn mark_delivered_once(
        &self,
        fence: &Fence,
        session_id: &str,
        seq: u64,
    ) -> Result<bool, SessionError> {
        let mut tx = self.begin().await?;
        lease::check(&mut tx, fence).await?;
        // The session's row first, as every write that writes its events.
        let (row, _) = locks::session(&mut tx, session_id).await?;
        let advanced = sqlx::query(
            "UPDATE processes SET delivered_seq = $1 WHERE session_id = $2 AND delivered_seq < $1",
        )
        .bind(seq as i64)
        .bind(session_id)
        .execute(&mut *tx)
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
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE messages SET delivered_at_ms = $1 \
             WHERE session_id = $2 AND seq <= $3 AND delivered_at_ms IS NULL",
        )
        .bind(now_ms())
        .bind(session_id)
        .bind(seq as i64)
        .execute(&mut *tx)
        .await?;
        // One event per delivery that advanced, however many messages.
        if advanced {
            let event = NewEvent::new(
                session_id,
                EventKind::Delivered,
                row.status,
                delivered_detail(seq),
            );
            events::write(&mut tx, &[event], false).await?;
        }
        tx.commit().await?;
        Ok(advanced)
    }

    pub(super) async fn record_progress_once(
        &self,
        session_id: &str,
        detail: &serde_json::Value,
        audit: &AuditRecord,
        check: MessageCheck<'_>,
    ) -> Result<u64, SessionError> {
        let mut tx = self.begin().await?;
        let (row, _) = locks::session(&mut tx, session_id).await?;
        check(&row)?;
        sqlx::query("UPDATE sessions SET last_progress = $2 WHERE session_id = $1")
            .bind(session_id)
            .bind(detail.to_string())
            .execute(&mut *tx)
            .await?;
        PgStore::insert_audit(&mut tx, audit).await?;
        let event = NewEvent {
            session_id: session_id.to_owned(),
            kind: EventKind::Progress,
            status: row.status,
            detail: detail.to_string(),
            bytes: None,
        };
        let written = events::write(&mut tx, &[event], false).await?;
        tx.commit().await?;
        Ok(written.first().map_or(0, |(_, seq)| *seq as u64))
    }

    pub(super) async fn fail_session_once(
        &self,
        fence: &Fence,
        session_id: &str,
        failure: Failure,
        detail: &str,
        audit: &AuditRecord,
    ) -> Result<bool, SessionError> {
        let mut tx = self.begin().await?;
        lease::check(&mut tx, fence).await?;
        locks::place_of(&mut tx, session_id).await?;
        let (row, _) = locks::session(&mut tx, session_id).await?;
        // A failure is an exit with its reason: it ends only an active session.
        let exit = ProcessChange::Exited(failure.exit(detail));
        let step = policy::process_step(row.status, &exit);
        let mut ended = false;
        if let (Some(status), Some(reason)) = (step.status, &step.end_reason) {
            ended = !locks::end_sessions(
                &mut tx,
                &[session_id.to_owned()],
                status,
                session_id,
                reason,
                reason,
            )
            .await?
            .is_empty();
        }
        if ended {
            // Its parent's notice is owed from this commit on.
            sqlx::query(
                "INSERT INTO processes (session_id, notify_parent, callback_due) \
                 SELECT session_id, notify_parent, notify_parent FROM sessions \
                 WHERE session_id = $1 \
                 ON CONFLICT (session_id) DO UPDATE SET callback_due = processes.notify_parent",
            )
            .bind(session_id)
            .execute(&mut *tx)
            .await?;
        }
        PgStore::insert_audit(&mut tx, audit).await?;
        if let (true, Some(kind), Some(status)) = (ended, step.event, step.status) {
            let own = locks::session(&mut tx, session_id).await?.0;
            let mut new_events = vec![NewEvent::new(
                session_id,
                kind,
                status,
                event_detail(&exit, 0, 0),
            )];
            new_events.extend(
                parent_end::apply(&mut tx, &own, &Principal::Troupe)
                    .await?
                    .events,
            );
            events::write(&mut tx, &new_events, true).await?;
        }
        tx.commit().await?;
        Ok(ended)
    }

    pub(super) async fn active_sessions_impl(&self) -> Result<Vec<SessionRow>, SessionError> {
        let raw: Vec<RawSession> = sqlx::query_as(concat!(
            "SELECT ",
            session_columns!(),
            " FROM sessions WHERE status IN ('pending', 'running') ORDER BY row_id"
        ))
        .fetch_all(&self.pool)
        .await?;
        super::open::rows(raw)
    }
}
