//! Session reads on SQLite: from the ledger, which is exact (see the
//! module's header), never the database.

use std::sync::Arc;

use super::SqliteStore;
use crate::{
    error::SessionError,
    model::{SessionRow, Trust, WorkspaceId},
};

impl SqliteStore {
    pub(crate) async fn get_session_impl(
        &self,
        session_id: &str,
    ) -> Result<Option<SessionRow>, SessionError> {
        Ok(self.ledger().get(session_id))
    }

    pub(crate) async fn children_impl(
        &self,
        session_id: &str,
    ) -> Result<Vec<SessionRow>, SessionError> {
        Ok(self.ledger().children(session_id))
    }

    pub(crate) async fn list_workspace_impl(
        &self,
        workspace_id: &str,
        sandboxed_only: bool,
        include_ended: bool,
        after: i64,
        limit: u32,
    ) -> Result<(Vec<Arc<SessionRow>>, Option<i64>), SessionError> {
        Ok(self
            .ledger()
            .list(workspace_id, sandboxed_only, include_ended, after, limit))
    }

    pub(crate) async fn active_counts_impl(
        &self,
    ) -> Result<Vec<(WorkspaceId, Trust, u32)>, SessionError> {
        Ok(self.ledger().active_counts())
    }

    /// Every active session, in creation order.
    pub(crate) async fn active_sessions_impl(&self) -> Result<Vec<SessionRow>, SessionError> {
        Ok(self.ledger().active())
    }
}
