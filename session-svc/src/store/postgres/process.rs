//! The process side on PostgreSQL: which messages reached a session's
//! stdin, and the progress it reported (what its runner reports is written
//! once, in `store::process`).

use super::{
    PgStore,
    events::{self, NewEvent},
    lease, locks,
    open::{RawSession, session_columns},
};
use crate::{
    error::SessionError,
    model::{AuditRecord, EventDetail, EventKind, ProgressReport, SessionRow, now_ms},
    store::{Fence, MessageCheck, shared::delivered_detail},
};

impl PgStore {
    pub(in crate::store) async fn mark_delivered_once(
        &self,
        fence: &Fence,
        session_id: &str,
        seq: u64,
    ) -> Result<(), SessionError> {
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
                &delivered_detail(seq),
            );
            events::write(&mut tx, &[event], false).await?;
        }
        tx.commit().await?;
        if advanced {
            self.published(false);
        }
        Ok(())
    }

    pub(in crate::store) async fn record_progress_once(
        &self,
        session_id: &str,
        report: &ProgressReport,
        audit: &AuditRecord,
        check: MessageCheck<'_>,
    ) -> Result<u64, SessionError> {
        let mut tx = self.begin().await?;
        let (row, _) = locks::session(&mut tx, session_id).await?;
        check(&row)?;
        let detail = EventDetail::Progress(report.clone());
        sqlx::query("UPDATE sessions SET last_progress = $2 WHERE session_id = $1")
            .bind(session_id)
            .bind(detail.to_json())
            .execute(&mut *tx)
            .await?;
        PgStore::insert_audit(&mut tx, audit).await?;
        let event = NewEvent {
            session_id: session_id.to_owned(),
            kind: EventKind::Progress,
            status: row.status,
            detail: detail.to_json(),
            bytes: None,
        };
        let written = events::write(&mut tx, &[event], false).await?;
        tx.commit().await?;
        self.published(false);
        Ok(written.first().map_or(0, |(_, seq)| *seq as u64))
    }

    pub(in crate::store) async fn active_sessions_impl(
        &self,
    ) -> Result<Vec<SessionRow>, SessionError> {
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
