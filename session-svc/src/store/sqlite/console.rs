//! The web console's sign-ins: written through the writer, read on the
//! read pool.

use super::SqliteStore;
use crate::{
    error::SessionError,
    model::{
        Account, AuditRow, ConsoleSession, CsrfToken, MessageRecord, Principal, SessionActivity,
    },
    store::{
        ActivityColumns, AuditColumns, ConsoleStore, MessageColumns,
        accounts::{RawAccount, account_columns},
        audit_row,
    },
};

impl ConsoleStore for SqliteStore {
    async fn create_console_session(&self, session: &ConsoleSession) -> Result<(), SessionError> {
        let mut w = self.writer().await?;
        sqlx::query("DELETE FROM console_sessions WHERE expires_at_ms < ?")
            .bind(session.created_at_ms)
            .execute(&mut w.conn)
            .await?;
        sqlx::query(
            "INSERT INTO console_sessions (id_hash, csrf_token, created_at_ms, expires_at_ms) \
             VALUES (?, ?, ?, ?)",
        )
        .bind(&session.id_hash)
        .bind(session.csrf.expose())
        .bind(session.created_at_ms)
        .bind(session.expires_at_ms)
        .execute(&mut w.conn)
        .await?;
        Ok(())
    }

    async fn console_session(
        &self,
        id_hash: &str,
        now_ms: i64,
    ) -> Result<Option<ConsoleSession>, SessionError> {
        let row: Option<(String, String, i64, i64)> = sqlx::query_as(
            "SELECT id_hash, csrf_token, created_at_ms, expires_at_ms FROM console_sessions \
             WHERE id_hash = ? AND expires_at_ms >= ?",
        )
        .bind(id_hash)
        .bind(now_ms)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(
            |(id_hash, csrf, created_at_ms, expires_at_ms)| ConsoleSession {
                id_hash,
                csrf: CsrfToken::from_stored(csrf),
                created_at_ms,
                expires_at_ms,
            },
        ))
    }

    async fn delete_console_session(&self, id_hash: &str) -> Result<bool, SessionError> {
        let mut w = self.writer().await?;
        let done = sqlx::query("DELETE FROM console_sessions WHERE id_hash = ?")
            .bind(id_hash)
            .execute(&mut w.conn)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn session_messages(
        &self,
        session_id: &str,
        limit: u32,
    ) -> Result<Vec<MessageRecord>, SessionError> {
        let rows: Vec<MessageColumns> = sqlx::query_as(
            "SELECT m.message_id, m.session_id, m.seq, m.sender, \
               COALESCE(b.body, m.body) AS body, m.created_at_ms, m.delivered_at_ms \
             FROM messages m LEFT JOIN message_bodies b ON b.body_id = m.body_id \
             WHERE m.session_id = ?1 OR m.sender = ?2 \
             ORDER BY m.created_at_ms DESC, m.message_id DESC LIMIT ?3",
        )
        .bind(session_id)
        .bind(Principal::Session(session_id.to_owned()).to_string())
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        let mut messages = rows
            .into_iter()
            .map(MessageColumns::into_record)
            .collect::<Result<Vec<_>, _>>()?;
        messages.reverse();
        Ok(messages)
    }

    async fn workspace_activity(
        &self,
        workspace_id: &str,
    ) -> Result<Vec<SessionActivity>, SessionError> {
        let rows: Vec<ActivityColumns> = sqlx::query_as(
            "SELECT s.session_id, s.inbox_seq, COALESCE(p.delivered_seq, 0) AS delivered_seq, \
             s.last_progress FROM sessions s LEFT JOIN processes p ON p.session_id = s.session_id \
             WHERE s.workspace_id = ?1",
        )
        .bind(workspace_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(ActivityColumns::into_activity)
            .collect())
    }

    async fn sessions_activity(
        &self,
        ids: &[String],
    ) -> Result<Vec<SessionActivity>, SessionError> {
        let rows: Vec<ActivityColumns> = sqlx::query_as(
            "SELECT s.session_id, s.inbox_seq, COALESCE(p.delivered_seq, 0) AS delivered_seq, \
             s.last_progress FROM sessions s LEFT JOIN processes p ON p.session_id = s.session_id \
             WHERE s.session_id IN (SELECT value FROM json_each(?1))",
        )
        .bind(serde_json::Value::from(ids).to_string())
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(ActivityColumns::into_activity)
            .collect())
    }

    async fn accounts(&self, ids: &[String]) -> Result<Vec<Account>, SessionError> {
        let rows: Vec<RawAccount> = sqlx::query_as(concat!(
            "SELECT ",
            account_columns!(),
            " FROM accounts WHERE session_id IN (SELECT value FROM json_each(?1))"
        ))
        .bind(serde_json::Value::from(ids).to_string())
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(RawAccount::into_account).collect()
    }

    async fn refused_spawns(
        &self,
        workspace_id: &str,
        after_id: i64,
        limit: u32,
    ) -> Result<(Vec<AuditRow>, i64), SessionError> {
        // The cursor first: an entry written between the two reads is read
        // again from it, never missed.
        let newest: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM audit")
            .fetch_one(&self.pool)
            .await?;
        // Partial index `audit_refused_spawns`: refused spawns are few.
        let rows: Vec<AuditColumns> = sqlx::query_as(
            "SELECT id, at_ms, caller, action, target, allowed, reason, detail FROM audit \
             WHERE action = 'create_session' AND allowed = 0 AND id > ?1 AND id <= ?2 \
             AND target IN (SELECT session_id FROM sessions WHERE workspace_id = ?3) \
             ORDER BY id DESC LIMIT ?4",
        )
        .bind(after_id)
        .bind(newest)
        .bind(workspace_id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok((rows.into_iter().map(audit_row).collect(), newest))
    }
}
