//! Reads, each a query on the pool: sessions (by primary key, by parent,
//! by workspace page), events, inbox counts, audit and signing keys.

use std::sync::Arc;

use sqlx::Row;
use troupe_proto::status::parse_status;

use super::{
    PgStore,
    open::{RawSession, rows, session_columns},
};
use crate::{
    error::SessionError,
    model::{AuditRow, EventFilter, EventKind, EventRow, Principal, SessionRow, Trust},
    store::{EventPage, parse_stored},
};

impl PgStore {
    pub(super) async fn get_session_impl(
        &self,
        session_id: &str,
    ) -> Result<Option<SessionRow>, SessionError> {
        let raw: Option<RawSession> = sqlx::query_as(concat!(
            "SELECT ",
            session_columns!(),
            " FROM sessions WHERE session_id = $1"
        ))
        .bind(session_id)
        .fetch_optional(&self.pool)
        .await?;
        raw.map(RawSession::into_row).transpose()
    }

    pub(super) async fn children_impl(
        &self,
        session_id: &str,
    ) -> Result<Vec<SessionRow>, SessionError> {
        let raw: Vec<RawSession> = sqlx::query_as(concat!(
            "SELECT ",
            session_columns!(),
            " FROM sessions WHERE parent_session_id = $1 ORDER BY row_id"
        ))
        .bind(session_id)
        .fetch_all(&self.pool)
        .await?;
        rows(raw)
    }

    pub(super) async fn list_workspace_impl(
        &self,
        workspace_id: &str,
        sandboxed_only: bool,
        include_ended: bool,
        after: i64,
        limit: u32,
    ) -> Result<(Vec<Arc<SessionRow>>, Option<i64>), SessionError> {
        // One more than asked: whether a next page follows.
        let raw: Vec<RawSession> = sqlx::query_as(concat!(
            "SELECT ",
            session_columns!(),
            " FROM sessions WHERE workspace_id = $1 AND row_id > $2 \
              AND (NOT $3 OR trust_level = 'sandboxed') \
              AND ($4 OR status IN ('pending', 'running')) \
             ORDER BY row_id LIMIT $5"
        ))
        .bind(workspace_id)
        .bind(after)
        .bind(sandboxed_only)
        .bind(include_ended)
        .bind(i64::from(limit) + 1)
        .fetch_all(&self.pool)
        .await?;
        let more = raw.len() > limit as usize;
        let mut page = Vec::with_capacity(raw.len().min(limit as usize));
        let mut last = after;
        for raw in raw.into_iter().take(limit as usize) {
            last = raw.row_id;
            page.push(Arc::new(raw.into_row()?));
        }
        Ok((page, more.then_some(last)))
    }

    pub(super) async fn inbox_count_impl(&self, session_id: &str) -> Result<u64, SessionError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages WHERE session_id = $1")
            .bind(session_id)
            .fetch_one(&self.pool)
            .await?;
        Ok(n as u64)
    }

    pub(super) async fn unread_count_impl(&self, session_id: &str) -> Result<u64, SessionError> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM messages WHERE session_id = $1 AND delivered_at_ms IS NULL",
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
        // The pruning mark comes with the page, from the same snapshot; an
        // empty page asks for it apart (a mark moved past `after` since
        // means the cursor has expired since, which is what it says).
        let rows = sqlx::query(
            "SELECT (SELECT value FROM meta WHERE key = 'events_pruned_through') AS pruned, \
               e.id, e.seq, e.kind, e.status, e.at_ms, e.detail, e.session_id, s.workspace_id, \
               s.parent_session_id, s.parent_trust_level, s.tree_id, s.depth, s.trust_level \
             FROM events e JOIN sessions s ON s.session_id = e.session_id \
             WHERE e.id > $1 \
               AND ($2::text IS NULL OR e.session_id = $2) \
               AND ($3::text IS NULL OR s.tree_id = $3) \
               AND ($4::text IS NULL OR s.workspace_id = $4) \
               AND (NOT $5 OR s.trust_level = 'sandboxed') \
               AND (NOT $6 OR e.kind IN ('completed', 'failed', 'terminated')) \
             ORDER BY e.id LIMIT $7",
        )
        .bind(after)
        .bind(filter.session_id.as_deref())
        .bind(filter.tree_id.as_deref())
        .bind(filter.workspace_id.as_deref())
        .bind(filter.sandboxed_only)
        .bind(filter.ends_only)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        let pruned: i64 = match rows.first() {
            Some(row) => row.try_get("pruned")?,
            None => {
                sqlx::query_scalar("SELECT value FROM meta WHERE key = 'events_pruned_through'")
                    .fetch_one(&self.pool)
                    .await?
            }
        };
        if after > 0 && after < pruned {
            return Ok(EventPage::Expired {
                pruned_through: pruned,
            });
        }
        let mut events = Vec::with_capacity(rows.len());
        for row in &rows {
            let trust: String = row.try_get("trust_level")?;
            let parent_trust: Option<String> = row.try_get("parent_trust_level")?;
            let depth: i32 = row.try_get("depth")?;
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
                    .as_deref()
                    .map(|t| parse_stored("trust level", t, Trust::from_db))
                    .transpose()?,
                tree_id: row.try_get("tree_id")?,
                depth: depth as u32,
                trust: parse_stored("trust level", &trust, Trust::from_db)?,
            });
        }
        Ok(EventPage::Events(events))
    }

    pub(super) async fn newest_event_impl(&self) -> Result<i64, SessionError> {
        Ok(
            sqlx::query_scalar("SELECT COALESCE(MAX(id), 0)::bigint FROM events")
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
             WHERE id > $1 AND ($2::text IS NULL OR target = $2 OR caller = $3) \
             ORDER BY id LIMIT $4",
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

    pub(super) async fn active_counts_impl(
        &self,
    ) -> Result<Vec<(String, Trust, u32)>, SessionError> {
        let rows: Vec<(String, i32, i32)> = sqlx::query_as(
            "SELECT workspace_id, active_direct, active_sandboxed FROM workspaces \
             WHERE active_direct > 0 OR active_sandboxed > 0",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut counts = Vec::new();
        for (workspace, direct, sandboxed) in rows {
            for (trust, n) in [(Trust::Direct, direct), (Trust::Sandboxed, sandboxed)] {
                if n > 0 {
                    counts.push((workspace.clone(), trust, n as u32));
                }
            }
        }
        Ok(counts)
    }

    pub(super) async fn signing_keys_impl(&self) -> Result<Vec<(String, Vec<u8>)>, SessionError> {
        Ok(
            sqlx::query_as("SELECT kid, secret FROM signing_keys ORDER BY created_at_ms DESC, kid")
                .fetch_all(&self.pool)
                .await?,
        )
    }
}
