//! The shards' leases on PostgreSQL.
//!
//! A fenced write reads its shard's lease row `FOR KEY SHARE` first of all
//! (before the locks of `locks`), checking holder, epoch and expiry on the
//! database's clock. A takeover locks the row `FOR UPDATE SKIP LOCKED`, which
//! that lock holds off: it comes only after the writes of the term it ends,
//! and every later write of that term is refused. A try for a shard while a
//! write holds its row skips it at once, never waits, so a new term starts
//! with all its time. A renewal or a release changes no key, so it never
//! waits behind the writes it protects (`FOR NO KEY UPDATE` and `FOR KEY
//! SHARE` do not conflict). A stalled owner holds the row no longer than a
//! term: its fenced write's transaction may sit idle for the lease's time to
//! live, at most `IDLE_IN_TRANSACTION` (5 s, after which PostgreSQL ends the
//! connection).

use std::time::Duration;

use sqlx::PgConnection;

use super::{PgStore, db_now_ms, open::IDLE_IN_TRANSACTION};
use crate::{
    LeaseStore,
    error::SessionError,
    lease::{Fence, Holder, Lease, Replica, millis},
    shard::Shard,
};

/// Refuses the transaction unless `fence` is its shard's live term; keeps
/// the row key-share-locked until the commit. Every takeover waits for
/// that lock, so the transaction may sit idle (its process stalled: paused,
/// swapped out) no longer than the term's time to live (at most
/// `IDLE_IN_TRANSACTION`): a stalled owner then loses its connection, and
/// the write, instead of holding the next owner back past its lease.
pub(super) async fn check(conn: &mut PgConnection, fence: &Fence) -> Result<(), SessionError> {
    let idle = millis(fence.ttl.min(IDLE_IN_TRANSACTION)).max(1);
    let live: Option<String> = sqlx::query_scalar(
        "SELECT set_config('idle_in_transaction_session_timeout', $4, true) FROM leases \
         WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > clock_timestamp() \
         FOR KEY SHARE",
    )
    .bind(fence.shard.lease_name())
    .bind(fence.holder.as_str())
    .bind(fence.epoch)
    .bind(idle.to_string())
    .fetch_optional(conn)
    .await?;
    fence.held(live.is_some())
}

/// The keys (`name#epoch`) of `fences`, and their one holder.
fn keys(fences: &[Fence]) -> Option<(&Holder, Vec<String>)> {
    let holder = &fences.first()?.holder;
    debug_assert!(fences.iter().all(|f| &f.holder == holder));
    Some((holder, fences.iter().map(Fence::key).collect()))
}

/// Takes the free or expired rows among `names` (all shards' if `None`),
/// at most `want`, lowest shard first, skipping those a write holds.
async fn acquire(
    store: &PgStore,
    holder: &Holder,
    names: Option<Vec<String>>,
    want: usize,
    ttl: Duration,
) -> Result<Vec<Fence>, SessionError> {
    let names = &names;
    retrying!(async {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "WITH free AS (SELECT name FROM leases \
               WHERE name LIKE 'shard:%' AND ($2::text[] IS NULL OR name = ANY($2)) \
               AND expires_at <= clock_timestamp() \
               ORDER BY length(name), name LIMIT $4 FOR UPDATE SKIP LOCKED) \
             UPDATE leases SET holder = $1, epoch = leases.epoch + 1, \
               expires_at = clock_timestamp() + make_interval(secs => $3::float8 / 1000) \
             FROM free WHERE leases.name = free.name RETURNING leases.name, leases.epoch",
        )
        .bind(holder.as_str())
        .bind(names.clone())
        .bind(millis(ttl))
        .bind(i64::try_from(want).unwrap_or(i64::MAX))
        .fetch_all(&store.pool)
        .await?;
        Ok(Fence::taken(holder, rows, ttl))
    })
}

impl LeaseStore for PgStore {
    async fn acquire_shards(
        &self,
        holder: &Holder,
        want: usize,
        ttl: Duration,
    ) -> Result<Vec<Fence>, SessionError> {
        if want == 0 {
            return Ok(Vec::new());
        }
        acquire(self, holder, None, want, ttl).await
    }

    async fn acquire_shard(
        &self,
        holder: &Holder,
        shard: Shard,
        ttl: Duration,
    ) -> Result<Option<Fence>, SessionError> {
        let taken = acquire(self, holder, Some(vec![shard.lease_name()]), 1, ttl).await?;
        Ok(taken.into_iter().next())
    }

    async fn renew_shards(
        &self,
        fences: &[Fence],
        ttl: Duration,
    ) -> Result<Vec<Shard>, SessionError> {
        let Some((holder, keys)) = keys(fences) else {
            return Ok(Vec::new());
        };
        let keys = &keys;
        retrying!(async {
            let names: Vec<String> = sqlx::query_scalar(
                "UPDATE leases SET expires_at = clock_timestamp() + make_interval(secs => $3::float8 / 1000) \
                 WHERE holder = $1 AND name || '#' || epoch = ANY($2) \
                 AND expires_at > clock_timestamp() RETURNING name",
            )
            .bind(holder.as_str())
            .bind(keys)
            .bind(millis(ttl))
            .fetch_all(&self.pool)
            .await?;
            Ok(names
                .iter()
                .filter_map(|n| Shard::from_lease_name(n))
                .collect())
        })
    }

    async fn release_shards(&self, fences: &[Fence]) -> Result<(), SessionError> {
        let Some((holder, keys)) = keys(fences) else {
            return Ok(());
        };
        sqlx::query(
            "UPDATE leases SET expires_at = clock_timestamp() \
             WHERE holder = $1 AND name || '#' || epoch = ANY($2)",
        )
        .bind(holder.as_str())
        .bind(keys)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn shard_leases(&self) -> Result<Vec<Lease>, SessionError> {
        let rows: Vec<(String, String, i64, bool)> = sqlx::query_as(
            "SELECT name, holder, epoch, expires_at > clock_timestamp() FROM leases \
             WHERE name LIKE 'shard:%' ORDER BY length(name), name",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(crate::lease::leases_of(rows))
    }

    async fn heartbeat(&self, holder: &Holder, ttl: Duration) -> Result<Vec<Holder>, SessionError> {
        retrying!(async {
            let others: Vec<String> = sqlx::query_scalar(concat!(
                "WITH beat AS (INSERT INTO replicas (holder, expires_ms) VALUES ($1, ",
                db_now_ms!(),
                " + $2) ON CONFLICT (holder) DO UPDATE SET expires_ms = excluded.expires_ms \
                   RETURNING holder), \
                 gone AS (DELETE FROM replicas WHERE expires_ms < ",
                db_now_ms!(),
                " - 60000) \
                 SELECT holder FROM replicas WHERE holder <> $1 AND expires_ms > ",
                db_now_ms!()
            ))
            .bind(holder.as_str())
            .bind(millis(ttl))
            .fetch_all(&self.pool)
            .await?;
            Ok(crate::lease::live_with(others, holder))
        })
    }

    async fn leave(&self, holder: &Holder) -> Result<(), SessionError> {
        sqlx::query("DELETE FROM replicas WHERE holder = $1")
            .bind(holder.as_str())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn replicas(&self) -> Result<Vec<Replica>, SessionError> {
        let rows: Vec<(String, bool)> = sqlx::query_as(concat!(
            "SELECT holder, expires_ms > ",
            db_now_ms!(),
            " FROM replicas ORDER BY holder"
        ))
        .fetch_all(&self.pool)
        .await?;
        Ok(crate::lease::replicas_of(rows))
    }
}
