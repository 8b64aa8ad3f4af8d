//! The lock order and the counters it guards.
//!
//! Every transaction that checks a quota or changes what one counts locks,
//! in this order and before anything else it locks: the workspace's row of
//! `workspaces` (active sessions by trust), the tree's row of `trees`
//! (sessions ever), then session rows (a parent's `children` and
//! `spawn_tat_ms`, the sessions it ends), then `processes` rows. Output's
//! stripe of its shard (`output_stripes`), when taken, comes first of all;
//! the shards' rows of `event_shards` (`events`), in shard order, last of
//! all. With one order no two transactions wait on each other in a cycle,
//! and a check reads counts that stay true until its commit: N spawns at
//! limit-1 on any number of replicas give one success. Session rows are
//! locked `FOR NO KEY UPDATE`, which the foreign keys' checks of inserts
//! do not wait for. One write leaves the order: output past the total
//! budget drops other sessions' output under its shard's events row, and
//! may meet another session's process event in a deadlock, which
//! PostgreSQL breaks and `retrying!` runs again.
//!
//! A message's sender's `message_rates` row (its rate state) is locked
//! before any session row, and only by messages: a send or a fan-out
//! (`messages`) takes it, then its recipients' rows, those of a fan-out in
//! id order.
//!
//! Budgets' `accounts` rows stand apart (see `budgets`): reservations and
//! settlements lock them root-down (by depth), before any session row, and
//! no transaction holding a session row locks one (creates read them
//! unlocked).

use sqlx::PgConnection;
use troupe_proto::{session::SessionStatus, status::status_str};

use super::open::{RawSession, session_columns};
use crate::{
    error::SessionError,
    model::{SessionId, SessionRow},
};

/// Where a session's counters are: its workspace and its tree (neither
/// ever changes, so they are read without a lock).
pub(super) async fn place(
    conn: &mut PgConnection,
    session_id: &str,
) -> Result<(String, String), SessionError> {
    sqlx::query_as("SELECT workspace_id, tree_id FROM sessions WHERE session_id = $1")
        .bind(session_id)
        .fetch_optional(conn)
        .await?
        .ok_or_else(|| SessionError::not_found(session_id))
}

/// Locks a workspace's counter row; returns its active sessions.
pub(super) async fn workspace(
    conn: &mut PgConnection,
    workspace_id: &str,
) -> Result<u32, SessionError> {
    let active: i32 = sqlx::query_scalar(
        "SELECT active_direct + active_sandboxed FROM workspaces \
         WHERE workspace_id = $1 FOR NO KEY UPDATE",
    )
    .bind(workspace_id)
    .fetch_one(conn)
    .await?;
    Ok(active.max(0) as u32)
}

/// Locks a tree's counter row; returns the sessions it ever held, and how
/// many of them are sandboxed.
pub(super) async fn tree(
    conn: &mut PgConnection,
    tree_id: &str,
) -> Result<(u32, u32), SessionError> {
    let (sessions, sandboxed): (i32, i32) = sqlx::query_as(
        "SELECT sessions, sandboxed FROM trees WHERE tree_id = $1 FOR NO KEY UPDATE",
    )
    .bind(tree_id)
    .fetch_one(conn)
    .await?;
    Ok((sessions.max(0) as u32, sandboxed.max(0) as u32))
}

/// Locks a session's row (after its workspace and tree, if the caller
/// needs those); returns it and its children count.
pub(super) async fn session(
    conn: &mut PgConnection,
    session_id: &str,
) -> Result<(SessionRow, u32), SessionError> {
    let raw: RawSession = sqlx::query_as(concat!(
        "SELECT ",
        session_columns!(),
        " FROM sessions WHERE session_id = $1 FOR NO KEY UPDATE"
    ))
    .bind(session_id)
    .fetch_optional(conn)
    .await?
    .ok_or_else(|| SessionError::not_found(session_id))?;
    let children = raw.children.max(0) as u32;
    Ok((raw.into_row()?, children))
}

/// Locks the workspace and tree rows of `session_id`, in order.
pub(super) async fn place_of(
    conn: &mut PgConnection,
    session_id: &str,
) -> Result<(), SessionError> {
    let (workspace_id, tree_id) = place(&mut *conn, session_id).await?;
    workspace(&mut *conn, &workspace_id).await?;
    tree(conn, &tree_id).await?;
    Ok(())
}

/// Ends the active ones of `ids` (all of one workspace, whose row the
/// caller locked) with `status`, the reason `reason` for `target` and
/// `others` for the rest, and takes them off the workspace's active count;
/// returns their new rows.
pub(super) async fn end_sessions(
    conn: &mut PgConnection,
    ids: &[SessionId],
    status: SessionStatus,
    target: &str,
    reason: &str,
    others: &str,
) -> Result<Vec<SessionRow>, SessionError> {
    let raw: Vec<RawSession> = sqlx::query_as(concat!(
        "WITH ended AS (UPDATE sessions SET status = $2, ended_at_ms = $3, \
           end_reason = CASE WHEN session_id = $4 THEN $5 ELSE $6 END \
           WHERE session_id = ANY($1) AND status IN ('pending', 'running') RETURNING *), \
         counted AS (UPDATE workspaces w SET \
           active_direct = active_direct - e.direct, active_sandboxed = active_sandboxed - e.sandboxed \
           FROM (SELECT workspace_id, \
                   COUNT(*) FILTER (WHERE trust_level = 'direct')::int AS direct, \
                   COUNT(*) FILTER (WHERE trust_level = 'sandboxed')::int AS sandboxed \
                 FROM ended GROUP BY workspace_id) e \
           WHERE w.workspace_id = e.workspace_id) \
         SELECT ",
        session_columns!(),
        " FROM ended"
    ))
    .bind(ids)
    .bind(status_str(status))
    .bind(crate::model::now_ms())
    .bind(target)
    .bind(reason)
    .bind(others)
    .fetch_all(conn)
    .await?;
    super::open::rows(raw)
}

/// The active sessions of `target`'s subtree: itself first, then level by
/// level in creation order.
pub(super) async fn active_subtree(
    conn: &mut PgConnection,
    target: &str,
) -> Result<Vec<SessionId>, SessionError> {
    Ok(sqlx::query_scalar(
        "WITH RECURSIVE down(session_id, row_id, status, level) AS ( \
           SELECT session_id, row_id, status, 0 FROM sessions WHERE session_id = $1 \
           UNION ALL \
           SELECT s.session_id, s.row_id, s.status, down.level + 1 \
           FROM sessions s JOIN down ON s.parent_session_id = down.session_id) \
         SELECT session_id FROM down WHERE status IN ('pending', 'running') \
         ORDER BY level, row_id",
    )
    .bind(target)
    .fetch_all(conn)
    .await?)
}
