//! What creates and messages (written once, in `creates` and
//! `messages`) need of PostgreSQL: their transaction is an ordinary
//! one (`Batched` is `Tx`), each statement sent as it comes. The rows a
//! rule reads are locked in the lock order of `locks` before it runs: a
//! create's workspace, tree and parent; a message's sender's rate row, then
//! its recipients' rows in id order. A request id is claimed by inserting
//! its row first of all, so a concurrent call with the same id waits for
//! this one's end (`events::claim`).

use sqlx::PgConnection;

use super::{
    PgStore, Tx, events, locks,
    open::{RawSession, session_columns},
};
use crate::{
    error::SessionError,
    model::{
        Audience, AuditRecord, Idempotency, MessageRate, NewMessage, SessionId, SessionRow, Trust,
    },
    {
        accounts::{INSERT_ACCOUNT, bind_account},
        creates::{INSERT_SESSION, SpawnFacts, bind_session, sandboxed},
        journal::NewEvent,
    },
};

/// A transaction of creates and messages: an ordinary one here.
pub(crate) type Batched<'s> = Tx<'s>;

impl PgStore {
    /// Begins a transaction of creates and messages (see `backends`).
    pub(crate) async fn batched(&self) -> Result<Batched<'_>, SessionError> {
        self.tx().await
    }
}

impl Tx<'_> {
    /// Claims a request id (`events::claim`): `Some` with the earlier
    /// call's result, or a conflict.
    pub(crate) async fn claim(
        &mut self,
        idem: &Idempotency,
    ) -> Result<Option<serde_json::Value>, SessionError> {
        events::claim(self.conn(), idem).await
    }

    /// Stores the result of the call that claimed `idem`.
    pub(crate) async fn remember(
        &mut self,
        idem: Option<&Idempotency>,
        result: serde_json::Value,
    ) -> Result<(), SessionError> {
        events::remember(self.conn(), idem, result).await
    }

    pub(crate) async fn audit(&mut self, record: &AuditRecord) -> Result<(), SessionError> {
        PgStore::insert_audit(self.conn(), record).await
    }

    /// Writes `events`, last (`events::write`).
    pub(crate) async fn events(&mut self, events: &[NewEvent]) -> Result<(), SessionError> {
        events::write(self.conn(), events, false).await?;
        Ok(())
    }

    /// Locks the workspace's counter row (made on its first root); returns
    /// its active sessions.
    pub(crate) async fn workspace_active(
        &mut self,
        workspace_id: &str,
    ) -> Result<u32, SessionError> {
        let active: i32 = sqlx::query_scalar(
            "INSERT INTO workspaces (workspace_id) VALUES ($1) \
             ON CONFLICT (workspace_id) DO UPDATE SET active_direct = workspaces.active_direct \
             RETURNING active_direct + active_sandboxed",
        )
        .bind(workspace_id)
        .fetch_one(self.conn())
        .await?;
        Ok(active.max(0) as u32)
    }

    /// Locks the parent's workspace, tree and row, in the lock order;
    /// returns what a spawn's rule reads of them.
    pub(crate) async fn spawn_facts(
        &mut self,
        parent_id: &str,
    ) -> Result<SpawnFacts, SessionError> {
        let (workspace_id, tree_id) = locks::place(self.conn(), parent_id).await?;
        let workspace_active = locks::workspace(self.conn(), &workspace_id).await?;
        let (tree_sessions, tree_sandboxed) = locks::tree(self.conn(), &tree_id).await?;
        let (parent, children) = locks::session(self.conn(), parent_id).await?;
        Ok(SpawnFacts {
            parent,
            tree_sessions,
            tree_sandboxed,
            children,
            workspace_active,
        })
    }

    /// Counts a new root's tree.
    pub(crate) async fn count_root(
        &mut self,
        tree_id: &str,
        trust: Trust,
    ) -> Result<(), SessionError> {
        sqlx::query("INSERT INTO trees (tree_id, sessions, sandboxed) VALUES ($1, 1, $2)")
            .bind(tree_id)
            .bind(sandboxed(trust))
            .execute(self.conn())
            .await?;
        Ok(())
    }

    /// Counts a new child in its tree and its parent, whose spawn rate
    /// state becomes `tat_ms`.
    pub(crate) async fn count_child(
        &mut self,
        parent: &SessionRow,
        tat_ms: i64,
        trust: Trust,
    ) -> Result<(), SessionError> {
        sqlx::query(
            "UPDATE trees SET sessions = sessions + 1, sandboxed = sandboxed + $2 \
             WHERE tree_id = $1",
        )
        .bind(&parent.tree_id)
        .bind(sandboxed(trust))
        .execute(self.conn())
        .await?;
        sqlx::query(
            "UPDATE sessions SET children = children + 1, spawn_tat_ms = $2 WHERE session_id = $1",
        )
        .bind(&parent.session_id)
        .bind(tat_ms)
        .execute(self.conn())
        .await?;
        Ok(())
    }

    /// Inserts a pending session's row and counts it active in its
    /// workspace (whose row the transaction locked).
    pub(crate) async fn insert_session(
        &mut self,
        row: &SessionRow,
        notify_parent: bool,
    ) -> Result<(), SessionError> {
        bind_session!(sqlx::query(INSERT_SESSION), row, notify_parent)
            .execute(self.conn())
            .await?;
        sqlx::query(
            "UPDATE workspaces SET \
               active_direct = active_direct + ($2 = 'direct')::int, \
               active_sandboxed = active_sandboxed + ($2 = 'sandboxed')::int \
             WHERE workspace_id = $1",
        )
        .bind(&row.workspace_id)
        .bind(row.trust.as_str())
        .execute(self.conn())
        .await?;
        Ok(())
    }

    /// Inserts a new session's account: its budget's limits (as stored,
    /// `accounts::stored_budget`) and its deadline.
    pub(crate) async fn account(
        &mut self,
        session_id: &str,
        depth: u32,
        limits: [Option<i64>; 4],
        deadline_ms: Option<i64>,
    ) -> Result<(), SessionError> {
        bind_account!(
            sqlx::query(INSERT_ACCOUNT),
            session_id,
            depth,
            limits,
            deadline_ms
        )
        .execute(self.conn())
        .await?;
        Ok(())
    }

    /// Stores a message's body once, under `body_id`.
    pub(crate) async fn body(&mut self, body_id: &str, body: &str) -> Result<(), SessionError> {
        insert_body(self.conn(), body_id, body).await
    }

    /// Appends `message` to `recipient`'s inbox (its row locked) as
    /// `sequence`, its body the one stored under `body_id`.
    pub(crate) async fn entry(
        &mut self,
        recipient: &str,
        message: &NewMessage,
        body_id: &str,
        sequence: i64,
    ) -> Result<(), SessionError> {
        let stored = insert_entry(self.conn(), recipient, message, body_id).await?;
        if stored != sequence {
            return Err(SessionError::Internal(format!(
                "inbox sequence {stored} stored where {sequence} was expected"
            )));
        }
        Ok(())
    }

    /// Locks the sender's message rate row (made at zero if it has none);
    /// returns its state.
    pub(crate) async fn rate(&mut self, sender: &str) -> Result<MessageRate, SessionError> {
        let (messages_tat_ms, bytes_tat_ms): (i64, i64) = sqlx::query_as(
            "INSERT INTO message_rates (session_id, tat_ms) VALUES ($1, 0) \
             ON CONFLICT (session_id) DO UPDATE SET tat_ms = message_rates.tat_ms \
             RETURNING tat_ms, bytes_tat_ms",
        )
        .bind(sender)
        .fetch_one(self.conn())
        .await?;
        Ok(MessageRate {
            messages_tat_ms,
            bytes_tat_ms,
        })
    }

    /// Sets the sender's (locked) rate state from `old` to `new`.
    pub(crate) async fn set_rate(
        &mut self,
        sender: &str,
        old: MessageRate,
        new: MessageRate,
    ) -> Result<(), SessionError> {
        if new == old {
            return Ok(());
        }
        sqlx::query(
            "UPDATE message_rates SET tat_ms = $2, bytes_tat_ms = $3 WHERE session_id = $1",
        )
        .bind(sender)
        .bind(new.messages_tat_ms)
        .bind(new.bytes_tat_ms)
        .execute(self.conn())
        .await?;
        Ok(())
    }

    /// The ids of the active sessions of an audience (not a group's), in
    /// the order they are answered.
    pub(crate) async fn audience(
        &mut self,
        audience: &Audience,
    ) -> Result<Vec<SessionId>, SessionError> {
        let active = "status IN ('pending', 'running')";
        let (sql, key) = match audience {
            Audience::Workspace(workspace_id) => (
                format!(
                    "SELECT session_id FROM sessions WHERE workspace_id = $1 AND {active} \
                     ORDER BY row_id"
                ),
                workspace_id.as_str(),
            ),
            Audience::Subtree(root) => (
                format!(
                    "WITH RECURSIVE down(session_id, depth, row_id, status) AS ( \
                       SELECT session_id, depth, row_id, status FROM sessions \
                       WHERE parent_session_id = $1 \
                       UNION ALL \
                       SELECT s.session_id, s.depth, s.row_id, s.status \
                       FROM sessions s JOIN down ON s.parent_session_id = down.session_id) \
                     SELECT session_id FROM down WHERE {active} ORDER BY depth, row_id"
                ),
                root.as_str(),
            ),
            Audience::Children(parent) => (
                format!(
                    "SELECT session_id FROM sessions WHERE parent_session_id = $1 AND {active} \
                     ORDER BY row_id"
                ),
                parent.as_str(),
            ),
            Audience::Group { .. } => {
                return Err(SessionError::Internal(
                    "a group's members are read by the fan-out".to_owned(),
                ));
            }
        };
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(key)
            .fetch_all(self.conn())
            .await?)
    }

    /// Locks the rows of `ids` (in id order); returns those that exist, in
    /// the order of `ids`.
    pub(crate) async fn lock_rows(
        &mut self,
        ids: &[SessionId],
    ) -> Result<Vec<SessionRow>, SessionError> {
        let raws: Vec<RawSession> = sqlx::query_as(concat!(
            "SELECT ",
            session_columns!(),
            " FROM sessions WHERE session_id = ANY($1) ORDER BY session_id FOR NO KEY UPDATE"
        ))
        .bind(ids)
        .fetch_all(self.conn())
        .await?;
        super::reads::in_order(raws, ids)
    }

    /// Clears a child's callback, due until now.
    pub(crate) async fn clear_callback(&mut self, child_id: &str) -> Result<(), SessionError> {
        sqlx::query("UPDATE processes SET callback_due = FALSE WHERE session_id = $1")
            .bind(child_id)
            .execute(self.conn())
            .await?;
        Ok(())
    }
}

/// Appends a message to one inbox, its body stored with it (the
/// recipient's row is locked by the caller, or new); returns its sequence.
pub(super) async fn insert_message(
    conn: &mut PgConnection,
    recipient: &str,
    message: &NewMessage,
) -> Result<i64, SessionError> {
    insert_body(&mut *conn, &message.message_id, &message.body).await?;
    insert_entry(conn, recipient, message, &message.message_id).await
}

/// Stores a message's body once, under `body_id`.
async fn insert_body(
    conn: &mut PgConnection,
    body_id: &str,
    body: &str,
) -> Result<(), SessionError> {
    sqlx::query(super::super::messages::INSERT_BODY)
        .bind(body_id)
        .bind(body)
        .execute(conn)
        .await?;
    Ok(())
}

/// Appends `message` to an inbox, its body the one stored under `body_id`
/// (the recipient's row is locked by the caller), and counts its bytes
/// unread; returns its sequence.
async fn insert_entry(
    conn: &mut PgConnection,
    recipient: &str,
    message: &NewMessage,
    body_id: &str,
) -> Result<i64, SessionError> {
    let bytes = message.body.len() as i64;
    let seq: i64 = sqlx::query_scalar(
        "UPDATE sessions SET inbox_seq = inbox_seq + 1, unread_bytes = unread_bytes + $2 \
         WHERE session_id = $1 RETURNING inbox_seq",
    )
    .bind(recipient)
    .bind(bytes)
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO messages (message_id, session_id, seq, sender, body, body_id, bytes, \
         created_at_ms) VALUES ($1, $2, $3, $4, '', $5, $6, $7)",
    )
    .bind(&message.message_id)
    .bind(recipient)
    .bind(seq)
    .bind(message.sender.to_string())
    .bind(body_id)
    .bind(bytes)
    .bind(crate::model::now_ms())
    .execute(conn)
    .await?;
    Ok(seq)
}
