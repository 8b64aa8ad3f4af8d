//! The store's background upkeep, each backend its own (`sqlite::upkeep`,
//! `postgres::events`): pruning events and request ids under the lease of
//! the fleet's upkeep, the shards of sessions written without one, and
//! what the backend needs besides.

use std::future::Future;

use crate::{Fence, Maintenance, backends::each_backend, error::SessionError};

/// The background upkeep; every [`super::Store`] is one.
pub trait UpkeepStore: Send + Sync {
    /// Deletes all but the newest `keep` events; returns the highest id
    /// pruned. Background work: refused unless `fence` is the lease's term.
    fn prune_events(
        &self,
        fence: &Fence,
        keep: u64,
    ) -> impl Future<Output = Result<i64, SessionError>> + Send;

    /// Deletes at most `limit` request-id records of callers' calls made
    /// before `before_ms` (ms since the Unix epoch), in one transaction;
    /// returns how many it deleted. Background work: refused unless `fence`
    /// is the lease's term.
    fn prune_request_ids(
        &self,
        fence: &Fence,
        before_ms: i64,
        limit: u32,
    ) -> impl Future<Output = Result<u64, SessionError>> + Send;

    /// Records the shard of sessions written without one (before shards,
    /// or by a replica of an older release), up to 100 workspaces' at a
    /// call; returns how many sessions it changed. Not fenced: any service
    /// writes the same.
    fn shard_sessions(&self) -> impl Future<Output = Result<u64, SessionError>> + Send;

    /// Periodic upkeep the backend needs (SQLite: checkpointing its
    /// write-ahead log, returning free pages to the file system), a bounded
    /// amount per call, off the request path; nothing for a backend that
    /// needs none. Called every second by the service.
    fn maintain(&self) -> impl Future<Output = Result<Maintenance, SessionError>> + Send;
}

each_backend! {
    use crate::{error::SessionError, shard::Shard};

    impl This {
        /// `UpkeepStore::shard_sessions`.
        pub(crate) async fn fill_shards(&self) -> Result<u64, SessionError> {
            fill_shards(&mut *self.write_conn().await?).await
        }
    }

    /// Records the shard of up to 100 workspaces' sessions written without
    /// one, and of their events; returns how many sessions it changed.
    pub(crate) async fn fill_shards(conn: &mut Conn) -> Result<u64, SessionError> {
        let workspaces: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT workspace_id FROM sessions WHERE shard < 0 LIMIT 100",
        )
        .fetch_all(&mut *conn)
        .await?;
        let mut filled = 0;
        for workspace in workspaces {
            let shard = i32::from(Shard::of(&workspace).index());
            sqlx::query(
                "UPDATE events SET shard = $1 WHERE shard < 0 AND session_id IN \
                   (SELECT session_id FROM sessions WHERE workspace_id = $2 AND shard < 0)",
            )
            .bind(shard)
            .bind(&workspace)
            .execute(&mut *conn)
            .await?;
            let done = sqlx::query(
                "UPDATE sessions SET shard = $1 WHERE workspace_id = $2 AND shard < 0",
            )
            .bind(shard)
            .bind(&workspace)
            .execute(&mut *conn)
            .await?;
            filled += done.rows_affected();
        }
        Ok(filled)
    }
}
