//! The lease of the background work on SQLite. One service
//! owns a SQLite database, so it is the only candidate, but the rules are
//! PostgreSQL's: every background write checks its fence inside its
//! transaction, on the database's clock.

use sqlx::SqliteConnection;

use super::SqliteStore;
use crate::LeaseStore;
use crate::{
    error::SessionError,
    lease::{BACKGROUND, Fence, Holder, Lease, millis},
};

/// The database's clock, in milliseconds since the Unix epoch.
const NOW_MS: &str = super::db_now_ms!();

/// Refuses the transaction unless `fence` is the lease's live term.
pub(super) async fn check(conn: &mut SqliteConnection, fence: &Fence) -> Result<(), SessionError> {
    let live: Option<i32> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT 1 FROM leases WHERE name = ? AND holder = ? AND epoch = ? AND expires_at_ms > {NOW_MS}"
    )))
    .bind(BACKGROUND)
    .bind(fence.holder.as_str())
    .bind(fence.epoch)
    .fetch_optional(conn)
    .await?;
    fence.held(live.is_some())
}

impl LeaseStore for SqliteStore {
    async fn acquire_lease(
        &self,
        holder: &Holder,
        ttl: std::time::Duration,
    ) -> Result<Option<Fence>, SessionError> {
        let epoch: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "INSERT INTO leases (name, holder, epoch, expires_at_ms) VALUES (?1, ?2, 1, {NOW_MS} + ?3) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, epoch = leases.epoch + 1, \
               expires_at_ms = excluded.expires_at_ms \
             WHERE leases.expires_at_ms <= {NOW_MS} RETURNING epoch"
        )))
        .bind(BACKGROUND)
        .bind(holder.as_str())
        .bind(millis(ttl))
        .fetch_optional(&mut self.writer().await?.conn)
        .await?;
        Ok(Fence::taken(holder, epoch, ttl))
    }

    async fn renew_lease(
        &self,
        fence: &Fence,
        ttl: std::time::Duration,
    ) -> Result<bool, SessionError> {
        let renewed = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE leases SET expires_at_ms = {NOW_MS} + ?4 \
             WHERE name = ?1 AND holder = ?2 AND epoch = ?3 AND expires_at_ms > {NOW_MS}"
        )))
        .bind(BACKGROUND)
        .bind(fence.holder.as_str())
        .bind(fence.epoch)
        .bind(millis(ttl))
        .execute(&mut self.writer().await?.conn)
        .await?;
        Ok(renewed.rows_affected() == 1)
    }

    async fn release_lease(&self, fence: &Fence) -> Result<(), SessionError> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE leases SET expires_at_ms = {NOW_MS} WHERE name = ? AND holder = ? AND epoch = ?"
        )))
        .bind(BACKGROUND)
        .bind(fence.holder.as_str())
        .bind(fence.epoch)
        .execute(&mut self.writer().await?.conn)
        .await?;
        Ok(())
    }

    async fn lease(&self) -> Result<Option<Lease>, SessionError> {
        let row: Option<(String, i64, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT holder, epoch, expires_at_ms > {NOW_MS} FROM leases WHERE name = ?"
        )))
        .bind(BACKGROUND)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|(holder, epoch, live)| Lease {
            holder: Holder::named(holder),
            epoch,
            live,
        }))
    }
}
