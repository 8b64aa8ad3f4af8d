//! The web console's sign-ins: one statement each, on the pool, so any
//! replica answers for a sign-in made on another.

use super::PgStore;
use crate::{
    error::SessionError,
    model::{ConsoleSession, CsrfToken, MessageRecord, Principal},
    store::MessageColumns,
};

impl PgStore {
    pub(super) async fn create_console_session_impl(
        &self,
        session: &ConsoleSession,
    ) -> Result<(), SessionError> {
        sqlx::query("DELETE FROM console_sessions WHERE expires_at_ms < $1")
            .bind(session.created_at_ms)
            .execute(&self.pool)
            .await?;
        sqlx::query(
            "INSERT INTO console_sessions (id_hash, csrf_token, created_at_ms, expires_at_ms) \
             VALUES ($1, $2, $3, $4)",
        )
        .bind(&session.id_hash)
        .bind(session.csrf.expose())
        .bind(session.created_at_ms)
        .bind(session.expires_at_ms)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub(super) async fn console_session_impl(
        &self,
        id_hash: &str,
        now_ms: i64,
    ) -> Result<Option<ConsoleSession>, SessionError> {
        let row: Option<(String, String, i64, i64)> = sqlx::query_as(
            "SELECT id_hash, csrf_token, created_at_ms, expires_at_ms FROM console_sessions \
             WHERE id_hash = $1 AND expires_at_ms >= $2",
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

    pub(super) async fn delete_console_session_impl(
        &self,
        id_hash: &str,
    ) -> Result<bool, SessionError> {
        let done = sqlx::query("DELETE FROM console_sessions WHERE id_hash = $1")
            .bind(id_hash)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    pub(super) async fn session_messages_impl(
        &self,
        session_id: &str,
        limit: u32,
    ) -> Result<Vec<MessageRecord>, SessionError> {
        let rows: Vec<MessageColumns> = sqlx::query_as(
            "SELECT message_id, session_id, seq, sender, body, created_at_ms, delivered_at_ms \
             FROM messages WHERE session_id = $1 OR sender = $2 \
             ORDER BY created_at_ms DESC, message_id DESC LIMIT $3",
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
}
