//! What ending sessions needs of SQLite (the code that ends them is written
//! once, in `ends` and `parent_end`): rows, subtrees and
//! members read from the ledger, which is exact under the writer lock, and
//! the statements that change rows, whose results the transaction hands
//! to the ledger at its commit.

use sqlx::SqliteConnection;
use troupe_proto::{session::SessionStatus, status::status_str};

use super::{
    SqliteStore, Tx,
    write::{INSERT_ENTRY, session_columns},
    writer::Change,
};
use crate::{
    error::SessionError,
    model::{EndReason, NewMessage, ProcessChange, SessionId, SessionRow, now_ms},
    policy::Member,
    {Fence, messages::INSERT_BODY, session_rows::RawSession, shared::json_ids},
};

impl SqliteStore {
    /// The active sessions below `session_id`, in creation order, as the
    /// parent-end rule reads them: the ledger is exact under the writer lock.
    pub(super) fn members_below(&self, session_id: &str) -> Vec<Member> {
        let ledger = self.ledger();
        ledger
            .active_subtree(session_id)
            .iter()
            .filter(|id| *id != session_id)
            .filter_map(|id| ledger.get(id))
            .map(|row| Member::of(&row))
            .collect()
    }

    /// Fails unless `fence` is the background work's current lease.
    pub(crate) async fn check_fence(
        conn: &mut SqliteConnection,
        fence: &Fence,
    ) -> Result<(), SessionError> {
        super::lease::check(conn, fence).await
    }
}

impl Tx<'_> {
    /// The row of `session_id`, which an end would change (PostgreSQL locks
    /// what it counts first; the writer lock holds it all here).
    pub(crate) async fn lock_session(
        &mut self,
        session_id: &str,
    ) -> Result<SessionRow, SessionError> {
        self.store.ledger_row(session_id)
    }

    /// The workspace of `session_id`, whose placement the writer lock
    /// serialises (none: no such session).
    pub(crate) async fn lock_placement(
        &mut self,
        session_id: &str,
    ) -> Result<Option<String>, SessionError> {
        Ok((self
            .store
            .ledger()
            .get(session_id)
            .map(|row| row.workspace_id))
        .map(Into::into))
    }

    /// The row of `session_id`, for a write of its events alone.
    pub(crate) async fn lock_row(&mut self, session_id: &str) -> Result<SessionRow, SessionError> {
        self.lock_session(session_id).await
    }

    /// The row of `session_id`, which the runner's `change` may change (the
    /// writer lock holds what PostgreSQL locks for it).
    pub(crate) async fn lock_process(
        &mut self,
        session_id: &str,
        _change: &ProcessChange,
    ) -> Result<SessionRow, SessionError> {
        self.lock_session(session_id).await
    }

    /// The row of `session_id`, whose output a write records.
    pub(crate) async fn lock_output(
        &mut self,
        session_id: &str,
    ) -> Result<SessionRow, SessionError> {
        self.lock_session(session_id).await
    }

    /// Sets a session's status (not an end); returns its new row.
    pub(crate) async fn set_status(
        &mut self,
        session_id: &str,
        status: SessionStatus,
    ) -> Result<SessionRow, SessionError> {
        let raws = sqlx::query_as(concat!(
            "UPDATE sessions SET status = $2 WHERE session_id = $1 RETURNING ",
            session_columns!()
        ))
        .bind(session_id)
        .bind(status_str(status))
        .fetch_all(self.conn())
        .await?;
        self.returned(raws, &[session_id.into()])?
            .pop()
            .ok_or_else(|| SessionError::not_found(session_id))
    }

    /// `session_id`'s ancestors, nearest first.
    pub(crate) async fn ancestors(
        &mut self,
        session_id: &str,
    ) -> Result<Vec<SessionId>, SessionError> {
        Ok(self.store.ledger().ancestors(session_id))
    }

    /// The active sessions of `session_id`'s subtree: itself first, then
    /// level by level in creation order.
    pub(crate) async fn active_subtree(
        &mut self,
        session_id: &str,
    ) -> Result<Vec<SessionId>, SessionError> {
        Ok(self.store.ledger().active_subtree(session_id))
    }

    /// The active sessions below `session_id`, as the parent-end rule reads
    /// them (`SqliteStore::members_below`).
    pub(crate) async fn members_below(
        &mut self,
        session_id: &str,
    ) -> Result<Vec<Member>, SessionError> {
        Ok(self.store.members_below(session_id))
    }

    /// Hands `raws`, the rows an update returned, to the ledger at the
    /// commit; returns them in the order of `ids`.
    fn returned(
        &mut self,
        raws: Vec<RawSession>,
        ids: &[SessionId],
    ) -> Result<Vec<SessionRow>, SessionError> {
        let mut rows = Vec::with_capacity(raws.len());
        for raw in raws {
            let rowid = raw.row_id;
            let row = raw.into_row()?;
            self.changed(Change::Row(rowid, Box::new(row.clone())));
            rows.push(row);
        }
        rows.sort_by_key(|r| ids.iter().position(|id| *id == r.session_id));
        Ok(rows)
    }

    /// Ends the active ones of `ids` with `status`, the reason `reason` for
    /// `target` and `others` for the rest; returns their new rows, in the
    /// order of `ids`.
    pub(crate) async fn end_sessions(
        &mut self,
        ids: &[SessionId],
        status: SessionStatus,
        target: &str,
        reason: &EndReason,
        others: &EndReason,
    ) -> Result<Vec<SessionRow>, SessionError> {
        let raws = sqlx::query_as(concat!(
            "UPDATE sessions SET status = $2, ended_at_ms = $3, \
             end_reason = CASE WHEN session_id = $4 THEN $5 ELSE $6 END \
             WHERE session_id IN (SELECT value FROM json_each($1)) \
             AND status IN ('pending', 'running') RETURNING ",
            session_columns!()
        ))
        .bind(json_ids(ids.iter().map(SessionId::as_str)))
        .bind(status_str(status))
        .bind(now_ms())
        .bind(target)
        .bind(reason.to_string())
        .bind(others.to_string())
        .fetch_all(self.conn())
        .await?;
        self.returned(raws, ids)
    }

    /// Marks the active ones of `ids` orphaned; returns their new rows, in
    /// the order of `ids`.
    pub(crate) async fn orphan(
        &mut self,
        ids: &[SessionId],
    ) -> Result<Vec<SessionRow>, SessionError> {
        let raws = sqlx::query_as(concat!(
            "UPDATE sessions SET orphaned = 1 \
             WHERE session_id IN (SELECT value FROM json_each($1)) \
             AND status IN ('pending', 'running') RETURNING ",
            session_columns!()
        ))
        .bind(json_ids(ids.iter().map(SessionId::as_str)))
        .fetch_all(self.conn())
        .await?;
        self.returned(raws, ids)
    }

    /// Appends a message to one inbox, its body stored with it (its
    /// sequence and unread bytes follow by trigger); returns its sequence.
    pub(crate) async fn insert_message(
        &mut self,
        recipient: &str,
        message: &NewMessage,
    ) -> Result<i64, SessionError> {
        sqlx::query(INSERT_BODY)
            .bind(&message.message_id)
            .bind(&message.body)
            .execute(self.conn())
            .await?;
        let seq: i64 = sqlx::query_scalar(INSERT_ENTRY)
            .bind(&message.message_id)
            .bind(message.sender.to_string())
            .bind(&message.message_id)
            .bind(message.body.len() as i64)
            .bind(now_ms())
            .bind(recipient)
            .fetch_one(self.conn())
            .await?;
        self.changed(Change::InboxSeq(recipient.to_owned(), seq));
        Ok(seq)
    }
}
