//! The process side: what each session's agent did, as the runner reported
//! it, which messages reached its stdin, the progress it reported, and its
//! failures. Each write is one transaction; one that may end a session
//! takes the workspace and tree locks first (see `locks`).

use sqlx::Row;
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
    model::{
        AuditRecord, EventKind, ExitReason, Failure, InboxMessage, Principal, ProcessChange,
        ProcessRow, ReceivedMessage, SessionRow, now_ms,
    },
    policy,
    store::{
        Fence, MessageCheck, parse_stored,
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

    pub(super) async fn process_impl(
        &self,
        session_id: &str,
    ) -> Result<Option<ProcessRow>, SessionError> {
        let row = sqlx::query(
            "SELECT runner_seq, exit_code, exit_reason, output_tail, delivered_seq, notify_parent, \
             callback_due, runner, stop_after_ms \
             FROM processes WHERE session_id = $1",
        )
        .bind(session_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| {
            let exit_reason: Option<&str> = row.try_get("exit_reason")?;
            Ok(ProcessRow {
                runner_seq: row.try_get::<i64, _>("runner_seq")? as u64,
                exit_code: row.try_get("exit_code")?,
                exit_reason: exit_reason
                    .map(|r| parse_stored("exit reason", r, ExitReason::parse))
                    .transpose()?,
                output_tail: row.try_get("output_tail")?,
                delivered_seq: row.try_get::<i64, _>("delivered_seq")? as u64,
                notify_parent: row.try_get("notify_parent")?,
                callback_due: row.try_get("callback_due")?,
                stop_after_ms: row.try_get("stop_after_ms")?,
                runner: row
                    .try_get::<Option<String>, _>("runner")?
                    .map(crate::model::RunnerName::stored),
            })
        })
        .transpose()
    }

    pub(super) async fn undelivered_impl(
        &self,
        session_id: &str,
    ) -> Result<Vec<InboxMessage>, SessionError> {
        let rows: Vec<(i64, String, String, String)> = sqlx::query_as(
            "SELECT m.seq, m.message_id, m.sender, COALESCE(b.body, m.body) \
             FROM messages m \
             LEFT JOIN message_bodies b ON b.body_id = m.body_id \
             LEFT JOIN processes p ON p.session_id = m.session_id \
             WHERE m.session_id = $1 AND m.seq > COALESCE(p.delivered_seq, 0) ORDER BY m.seq",
        )
        .bind(session_id)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(seq, message_id, sender, body)| {
                Ok(InboxMessage {
                    seq: seq as u64,
                    message_id,
                    sender: parse_stored("sender", &sender, Principal::parse)?,
                    body,
                })
            })
            .collect()
    }

    pub(super) async fn received_impl(
        &self,
        session_id: &str,
        limit: u32,
    ) -> Result<Vec<ReceivedMessage>, SessionError> {
        let rows: Vec<(i64, String, String, i64)> = sqlx::query_as(
            "SELECT seq, message_id, sender, created_at_ms FROM messages \
             WHERE session_id = $1 ORDER BY seq LIMIT $2",
        )
        .bind(session_id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(seq, message_id, sender, created_at_ms)| {
                Ok(ReceivedMessage {
                    seq: seq as u64,
                    message_id,
                    sender: parse_stored("sender", &sender, Principal::parse)?,
                    created_at_ms,
                })
            })
            .collect()
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
