//! The store's background upkeep, each backend its own (`sqlite::upkeep`,
//! `postgres::events`): pruning events and request ids under the lease of
//! the fleet's upkeep, the shards of sessions written without one, and
//! what the backend needs besides.

use std::future::Future;

use crate::{Fence, Maintenance, backends::each_backend, error::SessionError};

/// The background upkeep; every [`super::Store`] is one.
pub trait UpkeepStore: Send + Sync {
    /// Deletes the events of `fence`'s shard older than the fleet's newest
    /// `keep`; returns the shard's last position pruned (its pruning mark).
    /// Background work: refused unless `fence` is its shard's term. Each
    /// shard's owner prunes its own, so no pruning holds a fleet-wide lock.
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

    /// Deletes `shard`'s events older than the fleet's newest `keep` (by
    /// id: ids grow with positions within a shard, so those that go are the
    /// shard's oldest), in the open transaction, with what they counted of
    /// output; returns the shard's pruning mark. With something to prune it
    /// takes the shard's output stripe first, as output writes do, and its
    /// `event_shards` row last, as every event write does; with nothing, it
    /// locks and writes nothing.
    pub(crate) async fn prune_shard(
        conn: &mut Conn,
        shard: Shard,
        keep: u64,
    ) -> Result<i64, SessionError> {
        let shard = i32::from(shard.index());
        let below: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) - $1 FROM events")
            .bind(keep.min(i64::MAX as u64) as i64)
            .fetch_one(&mut *conn)
            .await?;
        let through: Option<i64> =
            sqlx::query_scalar("SELECT MAX(shard_seq) FROM events WHERE shard = $1 AND id <= $2")
                .bind(shard)
                .bind(below)
                .fetch_one(&mut *conn)
                .await?;
        let Some(through) = through else {
            // Nothing to prune: nothing locked, nothing written.
            return Ok(
                sqlx::query_scalar("SELECT pruned_through FROM event_shards WHERE shard = $1")
                    .bind(shard)
                    .fetch_one(&mut *conn)
                    .await?,
            );
        };
        sqlx::query(concat!(
            "SELECT bytes FROM output_stripes WHERE shard = $1",
            for_update!("NO KEY UPDATE")
        ))
        .bind(shard)
        .execute(&mut *conn)
        .await?;
        sqlx::query(
            "WITH gone AS (SELECT session_id, SUM(bytes) AS bytes FROM events \
               WHERE shard = $1 AND shard_seq <= $2 AND kind = 'output' \
               GROUP BY session_id ORDER BY session_id) \
             UPDATE processes SET output_bytes = CASE WHEN output_bytes > gone.bytes \
               THEN output_bytes - gone.bytes ELSE 0 END FROM gone \
             WHERE processes.session_id = gone.session_id",
        )
        .bind(shard)
        .bind(through)
        .execute(&mut *conn)
        .await?;
        sqlx::query(
            "UPDATE output_stripes SET bytes = bytes - (SELECT COALESCE(SUM(bytes), 0) \
               FROM events WHERE shard = $1 AND shard_seq <= $2 AND kind = 'output') \
             WHERE shard = $1",
        )
        .bind(shard)
        .bind(through)
        .execute(&mut *conn)
        .await?;
        sqlx::query("DELETE FROM events WHERE shard = $1 AND shard_seq <= $2")
            .bind(shard)
            .bind(through)
            .execute(&mut *conn)
            .await?;
        Ok(sqlx::query_scalar(
            "UPDATE event_shards SET pruned_through = CASE WHEN pruned_through > $2 \
               THEN pruned_through ELSE $2 END WHERE shard = $1 RETURNING pruned_through",
        )
        .bind(shard)
        .bind(through)
        .fetch_one(&mut *conn)
        .await?)
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
