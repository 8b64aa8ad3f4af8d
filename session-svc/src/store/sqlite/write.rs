//! [`Write`]: one `BEGIN IMMEDIATE` transaction on the store's single writer
//! connection, with the statements the store's write paths are made of.
//!
//! Each statement is a round trip to SQLite's worker thread, so each helper
//! is one statement: sequence counters advance, and the created and message
//! events are written, by trigger (see the migration), and inserted rows are
//! returned rather than read back.

use serde_json::json;
use sqlx::{Row, Sqlite, SqliteConnection, Transaction};
use troupe_proto::session::SessionStatus;

use super::{RawSession, session_from_row};
use crate::{
    error::{QuotaLeft, Reason, SessionError},
    model::{AuditRecord, Idempotency, NewMessage, NewSession, SessionRow, now_ms},
};

/// Expands to `SELECT <session columns>`, for `concat!`.
macro_rules! select_session {
    () => {
        "SELECT rowid, session_id, workspace_id, parent_session_id, parent_trust_level, tree_id, \
         depth, trust_level, agent_name, agent_command, title, status, created_by, created_at_ms, \
         ended_at_ms, end_reason, spawn_tat_ms, inbox_seq"
    };
}
pub(super) use select_session;

/// What a spawn's rules need to know about the parent, read in one statement.
pub(super) struct SpawnFacts {
    pub parent: SessionRow,
    pub tree_sessions: u32,
    pub children: u32,
    pub workspace_active: u32,
}

/// An open write transaction.
pub(super) struct Write<'c> {
    tx: Transaction<'c, Sqlite>,
}

impl<'c> Write<'c> {
    pub async fn begin(conn: &'c mut SqliteConnection) -> Result<Self, SessionError> {
        use sqlx::Connection;
        Ok(Write {
            tx: conn.begin_with("BEGIN IMMEDIATE").await?,
        })
    }

    /// The transaction's connection, for statements of other modules.
    pub fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }

    pub async fn commit(self) -> Result<(), SessionError> {
        Ok(self.tx.commit().await?)
    }

    pub async fn session(&mut self, session_id: &str) -> Result<Option<SessionRow>, SessionError> {
        let sql = concat!(select_session!(), " FROM sessions WHERE session_id = ?");
        let row = sqlx::query(sql)
            .bind(session_id)
            .fetch_optional(&mut *self.tx)
            .await?;
        row.as_ref().map(session_from_row).transpose()
    }

    /// Reads a parent with the counts the spawn quotas need.
    pub async fn spawn_facts(
        &mut self,
        parent_id: &str,
    ) -> Result<Option<SpawnFacts>, SessionError> {
        let sql = concat!(
            select_session!(),
            ", (SELECT COUNT(*) FROM sessions t WHERE t.tree_id = p.tree_id) AS tree_sessions, \
               (SELECT COUNT(*) FROM sessions c WHERE c.parent_session_id = p.session_id) AS children, \
               (SELECT COUNT(*) FROM sessions w WHERE w.workspace_id = p.workspace_id \
                  AND w.status IN ('pending', 'running')) AS workspace_active \
             FROM sessions p WHERE p.session_id = ?"
        );
        let Some(row) = sqlx::query(sql)
            .bind(parent_id)
            .fetch_optional(&mut *self.tx)
            .await?
        else {
            return Ok(None);
        };
        let count = |name: &str| row.try_get::<i64, _>(name).map(|n| n as u32);
        Ok(Some(SpawnFacts {
            tree_sessions: count("tree_sessions")?,
            children: count("children")?,
            workspace_active: count("workspace_active")?,
            parent: session_from_row(&row)?,
        }))
    }

    pub async fn active_in_workspace(&mut self, workspace_id: &str) -> Result<u32, SessionError> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM sessions WHERE workspace_id = ? AND status IN ('pending', 'running')",
        )
        .bind(workspace_id)
        .fetch_one(&mut *self.tx)
        .await?;
        Ok(n as u32)
    }

    /// Looks up an earlier call with the same key: its stored result if the
    /// payload matches, a conflict if it does not.
    pub async fn replay(
        &mut self,
        idem: Option<&Idempotency>,
    ) -> Result<Option<serde_json::Value>, SessionError> {
        let Some(idem) = idem else { return Ok(None) };
        let row = sqlx::query(
            "SELECT payload_hash, result FROM idempotency \
             WHERE caller = ? AND action = ? AND request_id = ?",
        )
        .bind(&idem.caller)
        .bind(idem.action)
        .bind(&idem.request_id)
        .fetch_optional(&mut *self.tx)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let hash: String = row.try_get("payload_hash")?;
        if hash != idem.payload_hash {
            return Err(SessionError::refused(
                Reason::IdempotencyConflict,
                format!(
                    "request_id {:?} was already used with a different payload",
                    idem.request_id
                ),
            ));
        }
        let result: String = row.try_get("result")?;
        serde_json::from_str(&result)
            .map(Some)
            .map_err(|e| SessionError::Internal(format!("bad idempotency record: {e}")))
    }

    /// Records the result of a call that carried a request id.
    pub async fn remember(
        &mut self,
        idem: Option<&Idempotency>,
        result: serde_json::Value,
    ) -> Result<(), SessionError> {
        let Some(idem) = idem else { return Ok(()) };
        sqlx::query(
            "INSERT INTO idempotency (caller, action, request_id, payload_hash, result, created_at_ms) \
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(&idem.caller)
        .bind(idem.action)
        .bind(&idem.request_id)
        .bind(&idem.payload_hash)
        .bind(result.to_string())
        .bind(now_ms())
        .execute(&mut *self.tx)
        .await?;
        Ok(())
    }

    /// Appends an event with the session's next sequence number.
    pub async fn event(
        &mut self,
        session_id: &str,
        kind: &str,
        status: &str,
        detail: serde_json::Value,
    ) -> Result<(), SessionError> {
        sqlx::query(
            "INSERT INTO events (session_id, seq, kind, status, at_ms, detail) \
             SELECT session_id, event_seq + 1, ?2, ?3, ?4, ?5 FROM sessions WHERE session_id = ?1",
        )
        .bind(session_id)
        .bind(kind)
        .bind(status)
        .bind(now_ms())
        .bind(detail.to_string())
        .execute(&mut *self.tx)
        .await?;
        Ok(())
    }

    pub async fn audit(&mut self, record: &AuditRecord) -> Result<(), SessionError> {
        insert_audit(&mut self.tx, record).await
    }

    /// Inserts a session and its initial message (their events follow by
    /// trigger); returns its row.
    pub async fn insert_session(
        &mut self,
        new: &NewSession,
        parent: Option<&SessionRow>,
        tree_id: &str,
        depth: u32,
    ) -> Result<SessionRow, SessionError> {
        let now = now_ms();
        let row = RawSession {
            rowid: 0,
            session_id: new.session_id.clone(),
            workspace_id: new.workspace_id.clone(),
            parent_session_id: parent.map(|p| p.session_id.clone()),
            parent_trust_level: parent.map(|p| p.trust.as_str().to_owned()),
            tree_id: tree_id.to_owned(),
            depth,
            trust_level: new.trust.as_str().to_owned(),
            agent_name: new.agent_name.clone(),
            agent_command: new.agent_command.clone(),
            title: new.title.clone(),
            status: "pending".to_owned(),
            created_by: new.created_by.clone(),
            created_at_ms: now,
            ended_at_ms: None,
            end_reason: None,
            spawn_tat_ms: 0,
            inbox_seq: 0,
        };
        sqlx::query(
            "INSERT INTO sessions (session_id, workspace_id, parent_session_id, parent_trust_level, \
             tree_id, depth, trust_level, agent_name, agent_command, title, status, created_by, \
             created_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&row.session_id)
        .bind(&row.workspace_id)
        .bind(&row.parent_session_id)
        .bind(&row.parent_trust_level)
        .bind(&row.tree_id)
        .bind(i64::from(row.depth))
        .bind(&row.trust_level)
        .bind(&row.agent_name)
        .bind(&row.agent_command)
        .bind(&row.title)
        .bind(&row.status)
        .bind(&row.created_by)
        .bind(row.created_at_ms)
        .execute(&mut *self.tx)
        .await?;
        let mut row = row.into_row()?;
        if let Some(message) = &new.initial_message {
            row.inbox_seq = self.message(&row, message).await? as i64;
        }
        Ok(row)
    }

    /// Appends a message to `recipient`'s inbox (its event follows by
    /// trigger); returns its sequence.
    pub async fn message(
        &mut self,
        recipient: &SessionRow,
        message: &NewMessage,
    ) -> Result<u64, SessionError> {
        let seq: i64 = sqlx::query_scalar(
            "INSERT INTO messages (message_id, session_id, seq, sender, body, created_at_ms) \
             SELECT ?1, session_id, inbox_seq + 1, ?3, ?4, ?5 FROM sessions WHERE session_id = ?2 \
             RETURNING seq",
        )
        .bind(&message.message_id)
        .bind(&recipient.session_id)
        .bind(&message.sender)
        .bind(&message.body)
        .bind(now_ms())
        .fetch_one(&mut *self.tx)
        .await?;
        Ok(seq as u64)
    }

    pub async fn set_spawn_tat(
        &mut self,
        session_id: &str,
        tat_ms: i64,
    ) -> Result<(), SessionError> {
        sqlx::query("UPDATE sessions SET spawn_tat_ms = ? WHERE session_id = ?")
            .bind(tat_ms)
            .bind(session_id)
            .execute(&mut *self.tx)
            .await?;
        Ok(())
    }

    /// Returns a session's ancestors, nearest first.
    pub async fn ancestors(&mut self, session_id: &str) -> Result<Vec<String>, SessionError> {
        Ok(sqlx::query_scalar(
            "WITH RECURSIVE anc(id, parent, n) AS ( \
               SELECT session_id, parent_session_id, 0 FROM sessions WHERE session_id = ? \
               UNION ALL \
               SELECT s.session_id, s.parent_session_id, anc.n + 1 \
               FROM sessions s JOIN anc ON s.session_id = anc.parent) \
             SELECT id FROM anc WHERE n > 0 ORDER BY n",
        )
        .bind(session_id)
        .fetch_all(&mut *self.tx)
        .await?)
    }

    /// Ends every active session of the subtree rooted at `target` (the
    /// target with `reason`, the rest with "cascade"); returns their ids,
    /// the target first, then level by level.
    pub async fn end_subtree(
        &mut self,
        target: &str,
        reason: &str,
        terminated_by: &str,
    ) -> Result<Vec<String>, SessionError> {
        let active: Vec<String> = sqlx::query_scalar(
            "WITH RECURSIVE sub(id, n) AS ( \
               SELECT ?, 0 \
               UNION ALL \
               SELECT s.session_id, sub.n + 1 FROM sessions s JOIN sub ON s.parent_session_id = sub.id) \
             SELECT s.session_id FROM sessions s JOIN sub ON s.session_id = sub.id \
             WHERE s.status IN ('pending', 'running') ORDER BY sub.n, s.rowid",
        )
        .bind(target)
        .fetch_all(&mut *self.tx)
        .await?;
        let now = now_ms();
        for id in &active {
            let why = if id == target { reason } else { "cascade" };
            sqlx::query(
                "UPDATE sessions SET status = 'terminated', ended_at_ms = ?, end_reason = ? \
                 WHERE session_id = ?",
            )
            .bind(now)
            .bind(why)
            .bind(id)
            .execute(&mut *self.tx)
            .await?;
            self.event(
                id,
                "terminated",
                troupe_proto::status::status_str(SessionStatus::Terminated),
                json!({"reason": why, "terminated_by": terminated_by}),
            )
            .await?;
        }
        Ok(active)
    }

    /// Deletes all but the newest `keep` events; returns the highest id pruned so far.
    pub async fn prune_events(&mut self, keep: u64) -> Result<i64, SessionError> {
        let through: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) - ? FROM events")
            .bind(keep.min(i64::MAX as u64) as i64)
            .fetch_one(&mut *self.tx)
            .await?;
        sqlx::query("DELETE FROM events WHERE id <= ?")
            .bind(through)
            .execute(&mut *self.tx)
            .await?;
        Ok(sqlx::query_scalar(
            "UPDATE meta SET value = MAX(value, ?) WHERE key = 'events_pruned_through' RETURNING value",
        )
        .bind(through)
        .fetch_one(&mut *self.tx)
        .await?)
    }
}

/// Appends an audit entry on `conn`, inside or outside a transaction.
pub(super) async fn insert_audit(
    conn: &mut SqliteConnection,
    record: &AuditRecord,
) -> Result<(), SessionError> {
    sqlx::query(
        "INSERT INTO audit (at_ms, caller, action, target, allowed, reason, detail) \
         VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(now_ms())
    .bind(&record.caller)
    .bind(record.action)
    .bind(&record.target)
    .bind(record.allowed)
    .bind(&record.reason)
    .bind(&record.detail)
    .execute(conn)
    .await?;
    Ok(())
}

pub(super) fn quota_json(q: &QuotaLeft) -> serde_json::Value {
    json!([
        q.tree_sessions_remaining,
        q.depth_remaining,
        q.children_remaining
    ])
}
