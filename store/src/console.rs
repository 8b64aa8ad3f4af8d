//! What the web console asks of a store beyond the service's own calls: its
//! sign-ins, a session's messages with their bodies, and the reads that let
//! a tree's snapshot carry what its page would otherwise rebuild by
//! replaying the workspace's events (each session's inbox and last
//! progress, the spawns refused to it), each one query whatever the number
//! of sessions.
//!
//! Both backends keep sign-ins in `console_sessions` (the id's hash, the
//! CSRF token, the expiry; expired ones removed at each sign-in), read an
//! inbox as `sessions.inbox_seq` against `processes.delivered_seq` and the
//! last progress from `sessions.last_progress` (written with each progress
//! event), and find refused spawns through the partial index
//! `audit_refused_spawns`. Written once for both backends (see `backends`):
//! a sign-in made on one replica holds on every other.

use std::future::Future;

use super::backends::each_backend;

use crate::{
    error::SessionError,
    model::{
        Account, AuditRow, ConsoleSession, MessageRecord, SessionActivity, SessionId, WorkspaceId,
    },
};

/// The console's reads and writes; every [`super::Store`] is one.
pub trait ConsoleStore: Send + Sync {
    /// Stores a console sign-in, and removes the sign-ins that have expired.
    fn create_console_session(
        &self,
        session: &ConsoleSession,
    ) -> impl Future<Output = Result<(), SessionError>> + Send;

    /// Returns the console sign-in whose id hashes to `id_hash`, unless it
    /// expired before `now_ms`.
    fn console_session(
        &self,
        id_hash: &str,
        now_ms: i64,
    ) -> impl Future<Output = Result<Option<ConsoleSession>, SessionError>> + Send;

    /// Removes a console sign-in (signing out); returns whether there was one.
    fn delete_console_session(
        &self,
        id_hash: &str,
    ) -> impl Future<Output = Result<bool, SessionError>> + Send;

    /// Returns the newest `limit` messages `session_id` received or sent,
    /// oldest first (by creation, then by message id: ids are time-ordered),
    /// bodies included.
    fn session_messages(
        &self,
        session_id: &SessionId,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<MessageRecord>, SessionError>> + Send;

    /// Returns each session of `workspace_id` (ended ones included) with
    /// its inbox (messages received, delivered through which sequence) and
    /// its last progress report, in one query.
    fn workspace_activity(
        &self,
        workspace_id: &WorkspaceId,
    ) -> impl Future<Output = Result<Vec<SessionActivity>, SessionError>> + Send;

    /// Returns what [`ConsoleStore::workspace_activity`] does, for the
    /// sessions `ids` alone (those that exist), in one query: a page of a
    /// tree's snapshot reads its own sessions', not the workspace's.
    fn sessions_activity(
        &self,
        ids: &[SessionId],
    ) -> impl Future<Output = Result<Vec<SessionActivity>, SessionError>> + Send;

    /// Returns the accounts (budget and usage) of the sessions `ids` that
    /// have one, in one query.
    fn accounts(
        &self,
        ids: &[SessionId],
    ) -> impl Future<Output = Result<Vec<Account>, SessionError>> + Send;

    /// Returns the newest `limit` refused spawns (audit entries of
    /// `create_session`, refused) after audit entry `after_id` whose target
    /// (the would-be parent) is a session of `workspace_id`, newest first,
    /// and the id of the newest audit entry of all, read first: a page asks
    /// again after it for the new ones alone.
    fn refused_spawns(
        &self,
        workspace_id: &WorkspaceId,
        after_id: i64,
        limit: u32,
    ) -> impl Future<Output = Result<(Vec<AuditRow>, i64), SessionError>> + Send;
}

each_backend! {
    use super::ConsoleStore;
    use crate::{
        error::SessionError,
        model::{WorkspaceId,
            Account, AuditRow, ConsoleSession, CsrfToken, MessageRecord, Principal,
            SessionActivity, SessionId,
        },
        {
            ActivityColumns, AuditColumns, MessageColumns,
            accounts::{RawAccount, account_columns},
            audit_row,
            shared::json_ids,
        },
    };

    impl ConsoleStore for This {
        async fn create_console_session(&self, session: &ConsoleSession) -> Result<(), SessionError> {
            let mut conn = self.write_conn().await?;
            sqlx::query("DELETE FROM console_sessions WHERE expires_at_ms < $1")
                .bind(session.created_at_ms)
                .execute(&mut *conn)
                .await?;
            sqlx::query(
                "INSERT INTO console_sessions (id_hash, csrf_token, created_at_ms, expires_at_ms) \
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(&session.id_hash)
            .bind(session.csrf.expose())
            .bind(session.created_at_ms)
            .bind(session.expires_at_ms)
            .execute(&mut *conn)
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

        async fn delete_console_session(&self, id_hash: &str) -> Result<bool, SessionError> {
            let done = sqlx::query("DELETE FROM console_sessions WHERE id_hash = $1")
                .bind(id_hash)
                .execute(&mut *self.write_conn().await?)
                .await?;
            Ok(done.rows_affected() > 0)
        }

        async fn session_messages(
            &self,
            session_id: &SessionId,
            limit: u32,
        ) -> Result<Vec<MessageRecord>, SessionError> {
            let rows: Vec<MessageColumns> = sqlx::query_as(
                "SELECT m.message_id, m.session_id, m.seq, m.sender, \
                   COALESCE(b.body, m.body) AS body, m.created_at_ms, m.delivered_at_ms \
                 FROM messages m LEFT JOIN message_bodies b ON b.body_id = m.body_id \
                 WHERE m.session_id = $1 OR m.sender = $2 \
                 ORDER BY m.created_at_ms DESC, m.message_id DESC LIMIT $3",
            )
            .bind(session_id)
            .bind(Principal::Session(session_id.clone()).to_string())
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
            workspace_id: &WorkspaceId,
        ) -> Result<Vec<SessionActivity>, SessionError> {
            let rows: Vec<ActivityColumns> = sqlx::query_as(
                "SELECT s.session_id, s.inbox_seq, COALESCE(p.delivered_seq, 0) AS delivered_seq, \
                 s.last_progress FROM sessions s LEFT JOIN processes p ON p.session_id = s.session_id \
                 WHERE s.workspace_id = $1",
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
            ids: &[SessionId],
        ) -> Result<Vec<SessionActivity>, SessionError> {
            let rows: Vec<ActivityColumns> = sqlx::query_as(concat!(
                "SELECT s.session_id, s.inbox_seq, COALESCE(p.delivered_seq, 0) AS delivered_seq, \
                 s.last_progress FROM sessions s LEFT JOIN processes p ON p.session_id = s.session_id \
                 WHERE s.session_id ",
                any_of!(1)
            ))
            .bind(json_ids(ids.iter().map(SessionId::as_str)))
            .fetch_all(&self.pool)
            .await?;
            Ok(rows
                .into_iter()
                .map(ActivityColumns::into_activity)
                .collect())
        }

        async fn accounts(&self, ids: &[SessionId]) -> Result<Vec<Account>, SessionError> {
            let rows: Vec<RawAccount> = sqlx::query_as(concat!(
                "SELECT ",
                account_columns!(),
                " FROM accounts WHERE session_id ",
                any_of!(1)
            ))
            .bind(json_ids(ids.iter().map(SessionId::as_str)))
            .fetch_all(&self.pool)
            .await?;
            rows.into_iter().map(RawAccount::into_account).collect()
        }

        async fn refused_spawns(
            &self,
            workspace_id: &WorkspaceId,
            after_id: i64,
            limit: u32,
        ) -> Result<(Vec<AuditRow>, i64), SessionError> {
            // The cursor first: an entry written between the two reads is read
            // again from it, never missed.
            let newest: i64 = sqlx::query_scalar("SELECT CAST(COALESCE(MAX(id), 0) AS BIGINT) FROM audit")
                .fetch_one(&self.pool)
                .await?;
            // Partial index `audit_refused_spawns`: refused spawns are few.
            let rows: Vec<AuditColumns> = sqlx::query_as(
                "SELECT id, at_ms, caller, action, target, allowed, reason, detail FROM audit \
                 WHERE action = 'create_session' AND NOT allowed AND id > $1 AND id <= $2 \
                 AND target IN (SELECT session_id FROM sessions WHERE workspace_id = $3) \
                 ORDER BY id DESC LIMIT $4",
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
}
