//! The process side on SQLite: which messages reached a session's stdin,
//! and the progress it reported (what its runner reports is written once,
//! in `store::process`).

use super::{SqliteStore, write::Write};
use crate::{
    error::SessionError,
    model::{AuditRecord, EventDetail, EventKind, ProgressReport, SessionRow, now_ms},
    store::{Fence, MessageCheck, shared::delivered_detail},
};

impl SqliteStore {
    pub(in crate::store) async fn mark_delivered_once(
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
            .bind(delivered_detail(seq).to_json())
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

    pub(in crate::store) async fn active_sessions_impl(
        &self,
    ) -> Result<Vec<SessionRow>, SessionError> {
        Ok(self.ledger().active())
    }

    pub(in crate::store) async fn record_progress_once(
        &self,
        session_id: &str,
        report: &ProgressReport,
        audit: &AuditRecord,
        check: MessageCheck<'_>,
    ) -> Result<u64, SessionError> {
        let mut w = self.writer().await?;
        let row = self
            .ledger()
            .get(session_id)
            .ok_or_else(|| SessionError::not_found(session_id))?;
        check(&row)?;
        let detail = EventDetail::Progress(report.clone());
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
        .bind(detail.to_json())
        .fetch_one(tx.conn())
        .await?;
        sqlx::query("UPDATE sessions SET last_progress = ?2 WHERE session_id = ?1")
            .bind(session_id)
            .bind(detail.to_json())
            .execute(tx.conn())
            .await?;
        tx.audit(audit).await?;
        tx.commit().await?;
        drop(w);
        self.published();
        Ok(sequence as u64)
    }
}
