//! Reads of the database on the read-only pool: events, inbox counts, audit
//! and signing keys. They never wait for the writer (WAL).

use sqlx::Row;
use troupe_proto::status::parse_status;

use super::SqliteStore;
use crate::{
    error::SessionError,
    model::{AuditRow, EventFilter, EventKind, EventRow, Principal, Trust},
    store::{EventPage, parse_stored},
};

impl SqliteStore {
    pub(super) async fn inbox_count_impl(&self, session_id: &str) -> Result<u64, SessionError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages WHERE session_id = ?")
            .bind(session_id)
            .fetch_one(&self.pool)
            .await?;
        Ok(n as u64)
    }

    pub(super) async fn unread_count_impl(&self, session_id: &str) -> Result<u64, SessionError> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM messages WHERE session_id = ? AND delivered_at_ms IS NULL",
        )
        .bind(session_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(n as u64)
    }

    pub(super) async fn events_after_impl(
        &self,
        filter: &EventFilter,
        after: i64,
        limit: u32,
    ) -> Result<EventPage, SessionError> {
        // One read transaction: the pruning mark and the page come from the same snapshot.
        let mut tx = self.pool.begin().await?;
        let pruned: i64 =
            sqlx::query_scalar("SELECT value FROM meta WHERE key = 'events_pruned_through'")
                .fetch_one(&mut *tx)
                .await?;
        if after > 0 && after < pruned {
            return Ok(EventPage::Expired {
                pruned_through: pruned,
            });
        }
        let rows = sqlx::query(
            "SELECT e.id, e.seq, e.kind, e.status, e.at_ms, e.detail, e.session_id, \
               s.workspace_id, s.parent_session_id, s.parent_trust_level, s.tree_id, s.depth, \
               s.trust_level \
             FROM events e JOIN sessions s ON s.session_id = e.session_id \
             WHERE e.id > ? \
               AND (?2 IS NULL OR e.session_id = ?2) \
               AND (?3 IS NULL OR s.tree_id = ?3) \
               AND (?4 IS NULL OR s.workspace_id = ?4) \
               AND (?5 = 0 OR s.trust_level = 'sandboxed') \
               AND (?6 = 0 OR e.kind IN ('completed', 'failed', 'terminated')) \
             ORDER BY e.id LIMIT ?7",
        )
        .bind(after)
        .bind(filter.session_id.as_deref())
        .bind(filter.tree_id.as_deref())
        .bind(filter.workspace_id.as_deref())
        .bind(filter.sandboxed_only)
        .bind(filter.ends_only)
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let mut events = Vec::with_capacity(rows.len());
        for row in &rows {
            let trust: &str = row.try_get("trust_level")?;
            let parent_trust: Option<&str> = row.try_get("parent_trust_level")?;
            let depth: i64 = row.try_get("depth")?;
            events.push(EventRow {
                id: row.try_get("id")?,
                seq: row.try_get("seq")?,
                kind: parse_stored("event kind", row.try_get("kind")?, EventKind::parse)?,
                status: parse_stored("status", row.try_get("status")?, parse_status)?,
                at_ms: row.try_get("at_ms")?,
                detail: row.try_get("detail")?,
                session_id: row.try_get("session_id")?,
                workspace_id: row.try_get("workspace_id")?,
                parent_session_id: row.try_get("parent_session_id")?,
                parent_trust: parent_trust
                    .map(|t| parse_stored("trust level", t, Trust::from_db))
                    .transpose()?,
                tree_id: row.try_get("tree_id")?,
                depth: depth as u32,
                trust: parse_stored("trust level", trust, Trust::from_db)?,
            });
        }
        Ok(EventPage::Events(events))
    }

    pub(super) async fn newest_event_impl(&self) -> Result<i64, SessionError> {
        Ok(
            sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM events")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    pub(super) async fn list_audit_impl(
        &self,
        session_id: Option<&str>,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<AuditRow>, SessionError> {
        let caller = session_id.map(|id| Principal::Session(id.to_owned()).to_string());
        let rows = sqlx::query(
            "SELECT id, at_ms, caller, action, target, allowed, reason, detail FROM audit \
             WHERE id > ?1 AND (?2 IS NULL OR target = ?2 OR caller = ?3) \
             ORDER BY id LIMIT ?4",
        )
        .bind(after_id)
        .bind(session_id)
        .bind(caller)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(AuditRow {
                    id: row.try_get("id")?,
                    at_ms: row.try_get("at_ms")?,
                    caller: row.try_get("caller")?,
                    action: row.try_get("action")?,
                    target: row.try_get("target")?,
                    allowed: row.try_get("allowed")?,
                    reason: row.try_get("reason")?,
                    detail: row.try_get("detail")?,
                })
            })
            .collect()
    }

    pub(super) async fn signing_keys_impl(&self) -> Result<Vec<(String, Vec<u8>)>, SessionError> {
        Ok(
            sqlx::query_as("SELECT kid, secret FROM signing_keys ORDER BY created_at_ms DESC, kid")
                .fetch_all(&self.pool)
                .await?,
        )
    }
}
