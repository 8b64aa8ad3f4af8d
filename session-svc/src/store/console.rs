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
//! `audit_refused_spawns`.

use std::future::Future;

use crate::{
    error::SessionError,
    model::{Account, AuditRow, ConsoleSession, MessageRecord, SessionActivity},
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
        session_id: &str,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<MessageRecord>, SessionError>> + Send;

    /// Returns each session of `workspace_id` (ended ones included) with
    /// its inbox (messages received, delivered through which sequence) and
    /// its last progress report, in one query.
    fn workspace_activity(
        &self,
        workspace_id: &str,
    ) -> impl Future<Output = Result<Vec<SessionActivity>, SessionError>> + Send;

    /// Returns what [`ConsoleStore::workspace_activity`] does, for the
    /// sessions `ids` alone (those that exist), in one query: a page of a
    /// tree's snapshot reads its own sessions', not the workspace's.
    fn sessions_activity(
        &self,
        ids: &[String],
    ) -> impl Future<Output = Result<Vec<SessionActivity>, SessionError>> + Send;

    /// Returns the accounts (budget and usage) of the sessions `ids` that
    /// have one, in one query.
    fn accounts(
        &self,
        ids: &[String],
    ) -> impl Future<Output = Result<Vec<Account>, SessionError>> + Send;

    /// Returns the newest `limit` refused spawns (audit entries of
    /// `create_session`, refused) after audit entry `after_id` whose target
    /// (the would-be parent) is a session of `workspace_id`, newest first,
    /// and the id of the newest audit entry of all, read first: a page asks
    /// again after it for the new ones alone.
    fn refused_spawns(
        &self,
        workspace_id: &str,
        after_id: i64,
        limit: u32,
    ) -> impl Future<Output = Result<(Vec<AuditRow>, i64), SessionError>> + Send;
}
