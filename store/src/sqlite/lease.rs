//! The shards' leases on SQLite. One service owns a SQLite database, so it
//! is the only candidate and holds every shard, but the rules are
//! PostgreSQL's: every background write checks its fence inside its
//! transaction, on the database's clock.

use std::time::Duration;

use sqlx::{AssertSqlSafe, SqliteConnection};

use super::SqliteStore;
use crate::{
    LeaseStore,
    error::SessionError,
    lease::{Fence, Holder, Lease, Replica, millis},
    shard::Shard,
};

/// The database's clock, in milliseconds since the Unix epoch.
const NOW_MS: &str = super::db_now_ms!();

/// Refuses the transaction unless `fence` is its shard's live term.
pub(super) async fn check(conn: &mut SqliteConnection, fence: &Fence) -> Result<(), SessionError> {
    let live: Option<i32> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT 1 FROM leases WHERE name = ? AND holder = ? AND epoch = ? AND expires_at_ms > {NOW_MS}"
    )))
    .bind(fence.shard.lease_name())
    .bind(fence.holder.as_str())
    .bind(fence.epoch)
    .fetch_optional(conn)
    .await?;
    fence.held(live.is_some())
}

/// The keys (`name#epoch`) of `fences` as a JSON array, and their holder.
fn keys(fences: &[Fence]) -> Option<(&Holder, String)> {
    let holder = &fences.first()?.holder;
    let keys: Vec<String> = fences.iter().map(Fence::key).collect();
    Some((holder, serde_json::to_string(&keys).expect("strings")))
}

impl SqliteStore {
    /// Takes the free or expired shard rows `names` matches (a JSON array;
    /// all shards' if `None`), at most `want`, lowest shard first.
    async fn acquire(
        &self,
        holder: &Holder,
        names: Option<String>,
        want: usize,
        ttl: Duration,
    ) -> Result<Vec<Fence>, SessionError> {
        let rows: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
            "UPDATE leases SET holder = ?1, epoch = epoch + 1, expires_at_ms = {NOW_MS} + ?2 \
             WHERE name IN (SELECT name FROM leases WHERE name LIKE 'shard:%' \
               AND (?3 IS NULL OR name IN (SELECT value FROM json_each(?3))) \
               AND expires_at_ms <= {NOW_MS} ORDER BY length(name), name LIMIT ?4) \
             RETURNING name, epoch"
        )))
        .bind(holder.as_str())
        .bind(millis(ttl))
        .bind(names)
        .bind(i64::try_from(want).unwrap_or(i64::MAX))
        .fetch_all(&mut self.writer().await?.conn)
        .await?;
        Ok(Fence::taken(holder, rows, ttl))
    }
}

impl LeaseStore for SqliteStore {
    async fn acquire_shards(
        &self,
        holder: &Holder,
        want: usize,
        ttl: Duration,
    ) -> Result<Vec<Fence>, SessionError> {
        if want == 0 {
            return Ok(Vec::new());
        }
        self.acquire(holder, None, want, ttl).await
    }

    async fn acquire_shard(
        &self,
        holder: &Holder,
        shard: Shard,
        ttl: Duration,
    ) -> Result<Option<Fence>, SessionError> {
        let names = serde_json::to_string(&[shard.lease_name()]).expect("strings");
        Ok(self
            .acquire(holder, Some(names), 1, ttl)
            .await?
            .into_iter()
            .next())
    }

    async fn renew_shards(
        &self,
        fences: &[Fence],
        ttl: Duration,
    ) -> Result<Vec<Shard>, SessionError> {
        let Some((holder, keys)) = keys(fences) else {
            return Ok(Vec::new());
        };
        let names: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "UPDATE leases SET expires_at_ms = {NOW_MS} + ?3 \
             WHERE holder = ?1 AND name || '#' || epoch IN (SELECT value FROM json_each(?2)) \
             AND expires_at_ms > {NOW_MS} RETURNING name"
        )))
        .bind(holder.as_str())
        .bind(keys)
        .bind(millis(ttl))
        .fetch_all(&mut self.writer().await?.conn)
        .await?;
        Ok(names
            .iter()
            .filter_map(|n| Shard::from_lease_name(n))
            .collect())
    }

    async fn release_shards(&self, fences: &[Fence]) -> Result<(), SessionError> {
        let Some((holder, keys)) = keys(fences) else {
            return Ok(());
        };
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE leases SET expires_at_ms = {NOW_MS} \
             WHERE holder = ?1 AND name || '#' || epoch IN (SELECT value FROM json_each(?2))"
        )))
        .bind(holder.as_str())
        .bind(keys)
        .execute(&mut self.writer().await?.conn)
        .await?;
        Ok(())
    }

    async fn shard_leases(&self) -> Result<Vec<Lease>, SessionError> {
        let rows: Vec<(String, String, i64, bool)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT name, holder, epoch, expires_at_ms > {NOW_MS} FROM leases \
             WHERE name LIKE 'shard:%' ORDER BY length(name), name"
        )))
        .fetch_all(&self.pool)
        .await?;
        Ok(crate::lease::leases_of(rows))
    }

    async fn heartbeat(&self, holder: &Holder, ttl: Duration) -> Result<Vec<Holder>, SessionError> {
        let mut writer = self.writer().await?;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO replicas (holder, expires_ms) VALUES (?1, {NOW_MS} + ?2) \
             ON CONFLICT (holder) DO UPDATE SET expires_ms = excluded.expires_ms"
        )))
        .bind(holder.as_str())
        .bind(millis(ttl))
        .execute(&mut writer.conn)
        .await?;
        sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM replicas WHERE expires_ms < {NOW_MS} - 60000"
        )))
        .execute(&mut writer.conn)
        .await?;
        let others: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT holder FROM replicas WHERE holder <> ?1 AND expires_ms > {NOW_MS}"
        )))
        .bind(holder.as_str())
        .fetch_all(&mut writer.conn)
        .await?;
        Ok(crate::lease::live_with(others, holder))
    }

    async fn leave(&self, holder: &Holder) -> Result<(), SessionError> {
        sqlx::query("DELETE FROM replicas WHERE holder = ?")
            .bind(holder.as_str())
            .execute(&mut self.writer().await?.conn)
            .await?;
        Ok(())
    }

    async fn replicas(&self) -> Result<Vec<Replica>, SessionError> {
        let rows: Vec<(String, bool)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT holder, expires_ms > {NOW_MS} FROM replicas ORDER BY holder"
        )))
        .fetch_all(&self.pool)
        .await?;
        Ok(crate::lease::replicas_of(rows))
    }
}
