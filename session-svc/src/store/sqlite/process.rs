//! The process side of the ledger: what each session's agent did, as the
//! runner reported it, which messages reached its stdin, and the progress
//! it reported.

use troupe_proto::status::status_str;

use super::{
    SqliteStore, parent_end,
    write::{Write, entry_from_row, session_columns},
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

impl SqliteStore {
    pub(super) async fn record_process_impl(
        &self,
        fence: &Fence,
        session_id: &str,
        runner_seq: u64,
        change: ProcessChange,
        tail_max: usize,
    ) -> Result<Option<SessionRow>, SessionError> {
        let mut w = self.writer().await?;
        let row = self
            .ledger()
            .get(session_id)
            .ok_or_else(|| SessionError::not_found(session_id))?;
        // An exit may end the session: its children's policies apply then.
        let members = match change {
            ProcessChange::Exited(_) if row.is_active() => self.members_below(session_id),
            _ => Vec::new(),
        };
        w.unsettled = std::iter::once(session_id.to_owned())
            .chain(members.iter().map(|m| m.session_id.clone()))
            .collect();
        let mut tx = Write::begin(&mut w.conn).await?;
        super::lease::check(tx.conn(), fence).await?;
        // A gap's first event: the one after the last applied.
        let gap_from = match change {
            ProcessChange::Truncated { .. } => {
                let last: Option<i64> =
                    sqlx::query_scalar("SELECT runner_seq FROM processes WHERE session_id = ?")
                        .bind(session_id)
                        .fetch_optional(tx.conn())
                        .await?;
                last.unwrap_or(0) as u64 + 1
            }
            _ => 0,
        };
        let applied: Option<i64> = sqlx::query_scalar(
            "INSERT INTO processes (session_id, runner_seq) VALUES (?1, ?2) \
             ON CONFLICT (session_id) DO UPDATE SET runner_seq = ?2 WHERE runner_seq < ?2 \
             RETURNING runner_seq",
        )
        .bind(session_id)
        .bind(runner_seq as i64)
        .fetch_optional(tx.conn())
        .await?;
        if applied.is_none() {
            drop(tx);
            w.unsettled.clear();
            return Ok(None);
        }
        let step = policy::process_step(row.status, &change);
        let status = step.status.unwrap_or(row.status);
        let mut changed = None;
        let mut below = Vec::new();
        if let ProcessChange::Exited(exit) = &change {
            sqlx::query(
                "UPDATE processes SET exit_code = ?, exit_reason = ?, \
                 callback_due = notify_parent WHERE session_id = ?",
            )
            .bind(exit.code)
            .bind(exit.reason.as_str())
            .bind(session_id)
            .execute(tx.conn())
            .await?;
        }
        match (step.status, &step.end_reason) {
            (Some(status), Some(reason)) => {
                changed = tx.end_session(session_id, status, reason).await?;
            }
            (Some(status), None) => {
                let started = sqlx::query(concat!(
                    "UPDATE sessions SET status = ? WHERE session_id = ? RETURNING ",
                    session_columns!()
                ))
                .bind(status_str(status))
                .bind(session_id)
                .fetch_one(tx.conn())
                .await?;
                changed = Some(entry_from_row(&started)?);
            }
            (None, _) => {}
        }
        match (step.event, change) {
            (None, _) => {}
            (Some(EventKind::Output), ProcessChange::Output { stream, data }) => {
                super::output::record(
                    tx.conn(),
                    session_id,
                    stream,
                    status,
                    &data,
                    tail_max,
                    self.output_budget,
                )
                .await?;
            }
            (Some(kind), change) => {
                tx.event(
                    session_id,
                    kind,
                    status,
                    event_detail(&change, runner_seq, gap_from),
                )
                .await?;
            }
        }
        if let (Some((_, ended)), Some(_)) = (&changed, &step.end_reason) {
            below = parent_end::apply(&mut tx, ended, &members, &Principal::Troupe)
                .await?
                .0;
        }
        tx.commit().await?;
        let row = {
            let mut ledger = self.ledger_mut();
            for (rowid, row) in below {
                ledger.put(rowid, row);
            }
            match changed {
                Some((rowid, row)) => {
                    ledger.put(rowid, row.clone());
                    row
                }
                None => row,
            }
        };
        w.unsettled.clear();
        drop(w);
        self.published();
        Ok(Some(row))
    }

    pub(super) async fn mark_delivered_impl(
        &self,
        fence: &Fence,
        session_id: &str,
        seq: u64,
    ) -> Result<(), SessionError> {
        let mut w = self.writer().await?;
        let mut tx = Write::begin(&mut w.conn).await?;
        super::lease::check(tx.conn(), fence).await?;
        let advanced = sqlx::query(
            "UPDATE processes SET delivered_seq = ?1 WHERE session_id = ?2 AND delivered_seq < ?1",
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
               WHERE session_id = ?1 AND seq <= ?2 AND delivered_at_ms IS NULL) \
             WHERE session_id = ?1",
        )
        .bind(session_id)
        .bind(seq as i64)
        .execute(tx.conn())
        .await?;
        sqlx::query(
            "UPDATE messages SET delivered_at_ms = ? \
             WHERE session_id = ? AND seq <= ? AND delivered_at_ms IS NULL",
        )
        .bind(now_ms())
        .bind(session_id)
        .bind(seq as i64)
        .execute(tx.conn())
        .await?;
        // One event per delivery that advanced, however many messages.
        if advanced {
            sqlx::query(
                "INSERT INTO events (session_id, seq, kind, status, at_ms, detail) \
                 SELECT session_id, event_seq + 1, ?2, status, ?3, ?4 FROM sessions \
                 WHERE session_id = ?1",
            )
            .bind(session_id)
            .bind(EventKind::Delivered.as_str())
            .bind(now_ms())
            .bind(delivered_detail(seq).to_string())
            .execute(tx.conn())
            .await?;
        }
        tx.commit().await?;
        drop(w);
        if advanced {
            self.published();
        }
        Ok(())
    }

    pub(super) async fn active_sessions_impl(&self) -> Result<Vec<SessionRow>, SessionError> {
        Ok(self.ledger().active())
    }

    pub(super) async fn record_progress_impl(
        &self,
        session_id: &str,
        detail: serde_json::Value,
        audit: AuditRecord,
        check: MessageCheck<'_>,
    ) -> Result<u64, SessionError> {
        let mut w = self.writer().await?;
        let row = self
            .ledger()
            .get(session_id)
            .ok_or_else(|| SessionError::not_found(session_id))?;
        check(&row)?;
        let mut tx = Write::begin(&mut w.conn).await?;
        let sequence: i64 = sqlx::query_scalar(
            "INSERT INTO events (session_id, seq, kind, status, at_ms, detail) \
             SELECT session_id, event_seq + 1, ?2, ?3, ?4, ?5 FROM sessions \
             WHERE session_id = ?1 RETURNING seq",
        )
        .bind(session_id)
        .bind(EventKind::Progress.as_str())
        .bind(troupe_proto::status::status_str(row.status))
        .bind(now_ms())
        .bind(detail.to_string())
        .fetch_one(tx.conn())
        .await?;
        sqlx::query("UPDATE sessions SET last_progress = ?2 WHERE session_id = ?1")
            .bind(session_id)
            .bind(detail.to_string())
            .execute(tx.conn())
            .await?;
        tx.audit(&audit).await?;
        tx.commit().await?;
        drop(w);
        self.published();
        Ok(sequence as u64)
    }

    pub(super) async fn fail_session_impl(
        &self,
        fence: &Fence,
        session_id: &str,
        failure: Failure,
        detail: &str,
        audit: AuditRecord,
    ) -> Result<bool, SessionError> {
        let mut w = self.writer().await?;
        let members = self.members_below(session_id);
        w.unsettled = std::iter::once(session_id.to_owned())
            .chain(members.iter().map(|m| m.session_id.clone()))
            .collect();
        // Under the writer lock the ledger is the database's state: the
        // step decides on the status the end would change.
        let step = self.ledger().get(session_id).map(|row| {
            let exit = ProcessChange::Exited(failure.exit(detail));
            (policy::process_step(row.status, &exit), exit)
        });
        let mut tx = Write::begin(&mut w.conn).await?;
        super::lease::check(tx.conn(), fence).await?;
        let mut ended = None;
        let mut below = Vec::new();
        if let Some((step, exit)) = step
            && let (Some(status), Some(reason)) = (step.status, &step.end_reason)
        {
            ended = tx.end_session(session_id, status, reason).await?;
            if let (Some(_), Some(kind)) = (&ended, step.event) {
                tx.event(session_id, kind, status, event_detail(&exit, 0, 0))
                    .await?;
                // Its parent's notice is owed from this commit on.
                sqlx::query(
                    "INSERT INTO processes (session_id, notify_parent, callback_due) \
                     SELECT session_id, notify_parent, notify_parent FROM sessions \
                     WHERE session_id = ?1 \
                     ON CONFLICT (session_id) DO UPDATE SET callback_due = notify_parent",
                )
                .bind(session_id)
                .execute(tx.conn())
                .await?;
            }
        }
        tx.audit(&audit).await?;
        if let Some((_, row)) = &ended {
            below = parent_end::apply(&mut tx, row, &members, &Principal::Troupe)
                .await?
                .0;
        }
        tx.commit().await?;
        let was_active = ended.is_some();
        {
            let mut ledger = self.ledger_mut();
            for (rowid, row) in below.into_iter().chain(ended) {
                ledger.put(rowid, row);
            }
        }
        w.unsettled.clear();
        drop(w);
        self.published();
        Ok(was_active)
    }
}
