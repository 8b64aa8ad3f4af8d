//! Reads, each a query on the pool: sessions (by primary key, by parent,
//! by workspace page), events, inbox counts, audit and signing keys.

use std::sync::Arc;

use sqlx::PgConnection;

use super::{
    PgStore,
    open::{RawSession, rows, session_columns},
};
use crate::{
    ReadStore,
    error::SessionError,
    model::{SessionId, SessionRow, Trust, WorkspaceId},
};

impl ReadStore for PgStore {
    async fn get_session(
        &self,
        session_id: &SessionId,
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

    async fn children(&self, session_id: &SessionId) -> Result<Vec<SessionRow>, SessionError> {
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

    async fn list_workspace(
        &self,
        workspace_id: &WorkspaceId,
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

    /// Every active session, in creation order.
    async fn active_sessions(&self) -> Result<Vec<SessionRow>, SessionError> {
        let raw: Vec<RawSession> = sqlx::query_as(concat!(
            "SELECT ",
            session_columns!(),
            " FROM sessions WHERE status IN ('pending', 'running') ORDER BY row_id"
        ))
        .fetch_all(&self.pool)
        .await?;
        super::open::rows(raw)
    }

    async fn active_counts(&self) -> Result<Vec<(WorkspaceId, Trust, u32)>, SessionError> {
        let rows: Vec<(WorkspaceId, i32, i32)> = sqlx::query_as(
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
}

impl PgStore {
    /// The row of the session `id`, unlocked, read on `conn`.
    pub(crate) async fn row_of(
        &self,
        conn: &mut PgConnection,
        id: &str,
    ) -> Result<SessionRow, SessionError> {
        self.rows_of(conn, &[id.into()])
            .await?
            .pop()
            .ok_or_else(|| SessionError::not_found(id))
    }

    /// The rows of the sessions `ids` that exist, unlocked, in the order of
    /// `ids`, read on `conn` (a transaction's, to see its own writes).
    pub(crate) async fn rows_of(
        &self,
        conn: &mut PgConnection,
        ids: &[SessionId],
    ) -> Result<Vec<SessionRow>, SessionError> {
        let raws: Vec<RawSession> = sqlx::query_as(concat!(
            "SELECT ",
            session_columns!(),
            " FROM sessions WHERE session_id = ANY($1)"
        ))
        .bind(ids)
        .fetch_all(conn)
        .await?;
        in_order(raws, ids)
    }
}

/// Session rows read, in the order of `ids`.
pub(super) fn in_order(
    raws: Vec<RawSession>,
    ids: &[SessionId],
) -> Result<Vec<SessionRow>, SessionError> {
    let mut rows = raws
        .into_iter()
        .map(RawSession::into_row)
        .collect::<Result<Vec<_>, _>>()?;
    rows.sort_by_key(|r| ids.iter().position(|id| *id == r.session_id));
    Ok(rows)
}
