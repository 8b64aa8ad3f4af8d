//! The lease of the background work on PostgreSQL.
//!
//! A fenced write reads the lease row `FOR SHARE` first of all (before the
//! locks of `locks`), checking holder, epoch and expiry on the database's
//! clock: a takeover updates the row, so it comes only after the writes of
//! the term it ends, and every later write of that term is refused. A try
//! for the lease while a write holds the row fails at once, never waits,
//! so a new term starts with all its time. A stalled owner holds the row
//! no longer than a term: its fenced write's transaction may sit idle for
//! the lease's time to live, at most `IDLE_IN_TRANSACTION` (5 s, after
//! which PostgreSQL ends the connection).

use sqlx::PgConnection;

use super::{PgStore, open::IDLE_IN_TRANSACTION};
use crate::{
    LeaseStore,
    error::SessionError,
    lease::{BACKGROUND, Fence, Holder, Lease, millis},
};

/// Refuses the transaction unless `fence` is the lease's live term; keeps
/// the row share-locked until the commit. Every takeover waits for that
/// lock, so the transaction may sit idle (its process stalled: paused,
/// swapped out) no longer than the term's time to live (at most
/// `IDLE_IN_TRANSACTION`): a stalled owner then loses its connection, and
/// the write, instead of holding the next owner back past its lease.
pub(super) async fn check(conn: &mut PgConnection, fence: &Fence) -> Result<(), SessionError> {
    let idle = millis(fence.ttl.min(IDLE_IN_TRANSACTION)).max(1);
    let live: Option<String> = sqlx::query_scalar(
        "SELECT set_config('idle_in_transaction_session_timeout', $4, true) FROM leases \
         WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > clock_timestamp() \
         FOR SHARE",
    )
    .bind(BACKGROUND)
    .bind(fence.holder.as_str())
    .bind(fence.epoch)
    .bind(idle.to_string())
    .fetch_optional(conn)
    .await?;
    fence.held(live.is_some())
}

impl LeaseStore for PgStore {
    async fn acquire_lease(
        &self,
        holder: &Holder,
        ttl: std::time::Duration,
    ) -> Result<Option<Fence>, SessionError> {
        retrying!(async {
            // The row of an expired term, unless a write of that term still
            // holds it (`check`): then this try fails at once, and the next
            // one comes a renewal later. A try never waits on the row, so a
            // term starts with all of its time, on both clocks.
            let epoch: Option<i64> = sqlx::query_scalar(
                "WITH free AS (SELECT name FROM leases \
                   WHERE name = $1 AND expires_at <= clock_timestamp() FOR UPDATE SKIP LOCKED), \
                 taken AS (UPDATE leases SET holder = $2, epoch = leases.epoch + 1, \
                   expires_at = clock_timestamp() + make_interval(secs => $3::float8 / 1000) \
                   FROM free WHERE leases.name = free.name RETURNING leases.epoch), \
                 first AS (INSERT INTO leases (name, holder, epoch, expires_at) \
                   SELECT $1, $2, 1, clock_timestamp() + make_interval(secs => $3::float8 / 1000) \
                   WHERE NOT EXISTS (SELECT 1 FROM leases WHERE name = $1) \
                   ON CONFLICT (name) DO NOTHING RETURNING epoch) \
                 SELECT epoch FROM taken UNION ALL SELECT epoch FROM first",
            )
            .bind(BACKGROUND)
            .bind(holder.as_str())
            .bind(millis(ttl))
            .fetch_optional(&self.pool)
            .await?;
            Ok(Fence::taken(holder, epoch, ttl))
        })
    }

    async fn renew_lease(
        &self,
        fence: &Fence,
        ttl: std::time::Duration,
    ) -> Result<bool, SessionError> {
        retrying!(async {
            let renewed = sqlx::query(
                "UPDATE leases SET expires_at = clock_timestamp() + make_interval(secs => $4::float8 / 1000) \
                 WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > clock_timestamp()",
            )
            .bind(BACKGROUND)
            .bind(fence.holder.as_str())
            .bind(fence.epoch)
            .bind(millis(ttl))
            .execute(&self.pool)
            .await?;
            Ok(renewed.rows_affected() == 1)
        })
    }

    async fn release_lease(&self, fence: &Fence) -> Result<(), SessionError> {
        sqlx::query(
            "UPDATE leases SET expires_at = clock_timestamp() \
             WHERE name = $1 AND holder = $2 AND epoch = $3",
        )
        .bind(BACKGROUND)
        .bind(fence.holder.as_str())
        .bind(fence.epoch)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn lease(&self) -> Result<Option<Lease>, SessionError> {
        let row: Option<(String, i64, bool)> = sqlx::query_as(
            "SELECT holder, epoch, expires_at > clock_timestamp() FROM leases WHERE name = $1",
        )
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
