//! Session reads on SQLite: from the ledger, which is exact (see the
//! module's header), never the database.

use std::sync::Arc;

use super::SqliteStore;
use crate::{
    ReadStore,
    error::SessionError,
    model::SessionId,
    model::{SessionRow, Trust, WorkspaceId},
};

impl ReadStore for SqliteStore {
    async fn get_session(
        &self,
        session_id: &SessionId,
    ) -> Result<Option<SessionRow>, SessionError> {
        Ok(self.ledger().get(session_id))
    }

    async fn children(&self, session_id: &SessionId) -> Result<Vec<SessionRow>, SessionError> {
        Ok(self.ledger().children(session_id))
    }

    async fn list_workspace(
        &self,
        workspace_id: &WorkspaceId,
        sandboxed_only: bool,
        include_ended: bool,
        after: i64,
        limit: u32,
    ) -> Result<(Vec<Arc<SessionRow>>, Option<i64>), SessionError> {
        Ok(self
            .ledger()
            .list(workspace_id, sandboxed_only, include_ended, after, limit))
    }

    /// Every active session, in creation order.
    async fn active_sessions(&self) -> Result<Vec<SessionRow>, SessionError> {
        Ok(self.ledger().active())
    }

    async fn active_counts(&self) -> Result<Vec<(WorkspaceId, Trust, u32)>, SessionError> {
        Ok(self.ledger().active_counts())
    }
}
