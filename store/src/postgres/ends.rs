//! What ending sessions needs of PostgreSQL (the code that ends them is
//! written once, in `ends` and `parent_end`): the ended
//! session's workspace and tree locked before its row (the lock order of
//! `locks`), subtrees and members read by recursive queries, and the
//! statements that change rows, their counters kept with them.

use sqlx::PgConnection;
use troupe_proto::{session::SessionStatus, status::status_str};

use super::{
    PgStore, Tx,
    batched::insert_message,
    lease, locks,
    open::{RawSession, session_columns},
    output,
};
use crate::{
    error::SessionError,
    model::{EndReason, NewMessage, ParentEnd, ProcessChange, SessionId, SessionRow},
    policy::Member,
    {Fence, parse_stored},
};

impl PgStore {
    /// Fails unless `fence` is the background work's current lease.
    pub(crate) async fn check_fence(
        conn: &mut PgConnection,
        fence: &Fence,
    ) -> Result<(), SessionError> {
        lease::check(conn, fence).await
    }
}

impl Tx<'_> {
    /// Locks what ending `session_id` changes, in the lock order: its
    /// workspace and tree (from here on no spawn can commit under it, and
    /// one committed before is seen), then its row; returns the row.
    pub(crate) async fn lock_session(
        &mut self,
        session_id: &str,
    ) -> Result<SessionRow, SessionError> {
        locks::place_of(self.conn(), session_id).await?;
        Ok(locks::session(self.conn(), session_id).await?.0)
    }

    /// Locks the counter row of `session_id`'s workspace, so placements of
    /// one workspace take turns; returns the workspace (none: no such
    /// session).
    pub(crate) async fn lock_placement(
        &mut self,
        session_id: &str,
    ) -> Result<Option<String>, SessionError> {
        let workspace_id = match locks::place(self.conn(), session_id).await {
            Ok((workspace_id, _)) => workspace_id,
            Err(SessionError::SessionNotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        locks::workspace(self.conn(), &workspace_id).await?;
        Ok(Some(workspace_id))
    }

    /// Locks the row of `session_id` (first, as every write of its events
    /// alone: no counter changes); returns it.
    pub(crate) async fn lock_row(&mut self, session_id: &str) -> Result<SessionRow, SessionError> {
        Ok(locks::session(self.conn(), session_id).await?.0)
    }

    /// Locks what the runner's `change` to `session_id` may change, in the
    /// lock order (output's total first; an exit's workspace and tree, as
    /// it may end the session), then its row; returns the row.
    pub(crate) async fn lock_process(
        &mut self,
        session_id: &str,
        change: &ProcessChange,
    ) -> Result<SessionRow, SessionError> {
        match change {
            ProcessChange::Output { .. } => return self.lock_output(session_id).await,
            ProcessChange::Exited(_) => locks::place_of(self.conn(), session_id).await?,
            _ => {}
        }
        Ok(locks::session(self.conn(), session_id).await?.0)
    }

    /// Locks what a write of `session_id`'s output changes, in the lock
    /// order: its stripe of output's total, then its row; returns the row.
    pub(crate) async fn lock_output(
        &mut self,
        session_id: &str,
    ) -> Result<SessionRow, SessionError> {
        output::lock_stripe(self.conn(), session_id).await?;
        Ok(locks::session(self.conn(), session_id).await?.0)
    }

    /// Sets a session's status (not an end); returns its new row.
    pub(crate) async fn set_status(
        &mut self,
        session_id: &str,
        status: SessionStatus,
    ) -> Result<SessionRow, SessionError> {
        let raw: RawSession = sqlx::query_as(concat!(
            "UPDATE sessions SET status = $2 WHERE session_id = $1 RETURNING ",
            session_columns!()
        ))
        .bind(session_id)
        .bind(status_str(status))
        .fetch_one(self.conn())
        .await?;
        raw.into_row()
    }

    /// `session_id`'s ancestors, nearest first.
    pub(crate) async fn ancestors(
        &mut self,
        session_id: &str,
    ) -> Result<Vec<SessionId>, SessionError> {
        Ok(sqlx::query_scalar(
            "WITH RECURSIVE up(session_id, parent, n) AS ( \
               SELECT session_id, parent_session_id, 0 FROM sessions WHERE session_id = $1 \
               UNION ALL \
               SELECT s.session_id, s.parent_session_id, up.n + 1 \
               FROM sessions s JOIN up ON s.session_id = up.parent) \
             SELECT session_id FROM up WHERE n > 0 ORDER BY n",
        )
        .bind(session_id)
        .fetch_all(self.conn())
        .await?)
    }

    /// The active sessions of `session_id`'s subtree: itself first, then
    /// level by level in creation order.
    pub(crate) async fn active_subtree(
        &mut self,
        session_id: &str,
    ) -> Result<Vec<SessionId>, SessionError> {
        locks::active_subtree(self.conn(), session_id).await
    }

    /// The active sessions below `session_id`, level by level, each level
    /// in creation order, as the parent-end rule reads them.
    pub(crate) async fn members_below(
        &mut self,
        session_id: &str,
    ) -> Result<Vec<Member>, SessionError> {
        let rows: Vec<(String, Option<String>, String)> = sqlx::query_as(
            "WITH RECURSIVE down(session_id, parent, row_id, status, policy, level) AS ( \
               SELECT session_id, parent_session_id, row_id, status, on_parent_end, 0 \
               FROM sessions WHERE session_id = $1 \
               UNION ALL \
               SELECT s.session_id, s.parent_session_id, s.row_id, s.status, s.on_parent_end, \
                 down.level + 1 \
               FROM sessions s JOIN down ON s.parent_session_id = down.session_id) \
             SELECT session_id, parent, policy FROM down \
             WHERE level > 0 AND status IN ('pending', 'running') ORDER BY level, row_id",
        )
        .bind(session_id)
        .fetch_all(self.conn())
        .await?;
        rows.into_iter()
            .map(|(session_id, parent_session_id, policy)| {
                Ok(Member {
                    session_id: session_id.into(),
                    parent_session_id: parent_session_id.map(Into::into),
                    on_parent_end: parse_stored("parent-end policy", &policy, ParentEnd::parse)?,
                })
            })
            .collect()
    }

    /// Ends the active ones of `ids` (all of one workspace, whose row
    /// [`Tx::lock_session`] locked) as `locks::end_sessions` does; returns
    /// their new rows, in the order of `ids`.
    pub(crate) async fn end_sessions(
        &mut self,
        ids: &[SessionId],
        status: SessionStatus,
        target: &str,
        reason: &EndReason,
        others: &EndReason,
    ) -> Result<Vec<SessionRow>, SessionError> {
        let mut rows = locks::end_sessions(
            self.conn(),
            ids,
            status,
            target,
            &reason.to_string(),
            &others.to_string(),
        )
        .await?;
        rows.sort_by_key(|r| ids.iter().position(|id| *id == r.session_id));
        Ok(rows)
    }

    /// Marks the active ones of `ids` orphaned; returns their new rows, in
    /// the order of `ids`.
    pub(crate) async fn orphan(
        &mut self,
        ids: &[SessionId],
    ) -> Result<Vec<SessionRow>, SessionError> {
        let raws: Vec<RawSession> = sqlx::query_as(concat!(
            "UPDATE sessions SET orphaned = TRUE \
             WHERE session_id = ANY($1) AND status IN ('pending', 'running') RETURNING ",
            session_columns!()
        ))
        .bind(ids)
        .fetch_all(self.conn())
        .await?;
        super::reads::in_order(raws, ids)
    }

    /// Appends a message to one inbox (its row locked by the caller), its
    /// body stored with it; returns its sequence.
    pub(crate) async fn insert_message(
        &mut self,
        recipient: &str,
        message: &NewMessage,
    ) -> Result<i64, SessionError> {
        insert_message(self.conn(), recipient, message).await
    }
}
