//! What is read of sessions' rows, each backend from its own: SQLite's
//! in-memory ledger (`sqlite::reads`), PostgreSQL's queries
//! (`postgres::reads`).

use std::{future::Future, sync::Arc};

use crate::{
    error::SessionError,
    model::{SessionId, SessionRow, Trust, WorkspaceId},
};

/// The reads of sessions; every [`super::Store`] is one.
pub trait ReadStore: Send + Sync {
    fn get_session(
        &self,
        session_id: &SessionId,
    ) -> impl Future<Output = Result<Option<SessionRow>, SessionError>> + Send;

    /// Returns a session's direct children, oldest first.
    fn children(
        &self,
        session_id: &SessionId,
    ) -> impl Future<Output = Result<Vec<SessionRow>, SessionError>> + Send;

    /// Lists a workspace's sessions in creation order, after `after` (a page
    /// token), at most `limit`. Returns the page (rows shared, not copied)
    /// and the next page token.
    fn list_workspace(
        &self,
        workspace_id: &WorkspaceId,
        sandboxed_only: bool,
        include_ended: bool,
        after: i64,
        limit: u32,
    ) -> impl Future<Output = Result<(Vec<Arc<SessionRow>>, Option<i64>), SessionError>> + Send;

    /// Returns every pending or running session.
    fn active_sessions(&self)
    -> impl Future<Output = Result<Vec<SessionRow>, SessionError>> + Send;

    /// Counts the pending or running sessions of each workspace, by trust
    /// level (only the non-zero counts). Metrics read it at every
    /// collection: a backend that answers without waiting is read there
    /// and then (see the service's `metrics::observe_active`).
    fn active_counts(
        &self,
    ) -> impl Future<Output = Result<Vec<(WorkspaceId, Trust, u32)>, SessionError>> + Send;
}
