//! The files' sizes: the write-ahead log, checkpointed off the request path
//! and cut back past its limit, and the database, which returns the pages
//! it no longer needs (incremental auto-vacuum). [`UpkeepStore::maintain`](crate::UpkeepStore::maintain) does
//! both, every second.
//!
//! The writer runs with `wal_autocheckpoint=0`: no call checkpoints while
//! the log is under its limit ([`WAL_LIMIT`](super::WAL_LIMIT), 64 MiB);
//! past it, the next writer truncates it first, so it stays within the
//! limit plus one write transaction. Free pages past 1 MiB are returned, at
//! most 4 MiB a pass. An older database without incremental auto-vacuum is
//! rewritten once by `VACUUM` at open.

use sqlx::{AssertSqlSafe, SqlitePool};

use super::{SqliteStore, write::Write};
use crate::UpkeepStore;
use crate::{
    error::SessionError,
    {Fence, Maintenance},
};

/// Free bytes the database keeps for the writes to come before it returns
/// any to the file system: pages freed and reused at once need no return.
const FREE_BYTES_KEPT: i64 = 1 << 20;
/// Most bytes one [`SqliteStore::reclaim`] returns: it holds the
/// writer while it moves pages, so each call stays short.
const RECLAIM_BYTES: i64 = 4 << 20;

/// Makes the database return the pages it frees (incremental auto-vacuum),
/// so that [`SqliteStore::reclaim`] can give them back to the file
/// system: a new database takes the setting before its first table; one
/// made without it is rewritten once by `VACUUM`, at open.
pub(super) async fn incremental_vacuum_on(pool: &SqlitePool) -> Result<(), SessionError> {
    let mut conn = pool.acquire().await?;
    sqlx::query("PRAGMA auto_vacuum = INCREMENTAL")
        .execute(&mut *conn)
        .await?;
    let mode: i64 = sqlx::query_scalar("PRAGMA auto_vacuum")
        .fetch_one(&mut *conn)
        .await?;
    // 2: incremental.
    if mode != 2 {
        tracing::info!("rewriting the database once so that it can return freed space");
        sqlx::query("VACUUM").execute(&mut *conn).await?;
    }
    Ok(())
}

impl UpkeepStore for SqliteStore {
    /// Fenced, in one write.
    async fn prune_events(&self, fence: &Fence, keep: u64) -> Result<i64, SessionError> {
        let mut w = self.writer().await?;
        let mut tx = Write::begin(&mut w.conn).await?;
        super::lease::check(tx.conn(), fence).await?;
        let pruned = crate::upkeep::sqlite::prune_shard(tx.conn(), fence.shard, keep).await?;
        tx.commit().await?;
        Ok(pruned)
    }

    /// Fenced, in one write.
    async fn prune_request_ids(
        &self,
        fence: &Fence,
        before_ms: i64,
        limit: u32,
    ) -> Result<u64, SessionError> {
        let mut w = self.writer().await?;
        let mut tx = Write::begin(&mut w.conn).await?;
        super::lease::check(tx.conn(), fence).await?;
        let pruned = tx.prune_request_ids(before_ms, limit).await?;
        tx.commit().await?;
        Ok(pruned)
    }

    async fn shard_sessions(&self) -> Result<u64, SessionError> {
        self.fill_shards().await
    }

    /// The store's own upkeep (releases stale
    /// reservations first): returns free pages, then checkpoints (which
    /// then cuts the file to size). A failure to return pages is logged
    /// and the checkpoint still runs; a failed checkpoint is the error.
    async fn maintain(&self) -> Result<Maintenance, SessionError> {
        crate::accounts::release_stale(self).await;
        let pages_returned = match self.reclaim().await {
            Ok(pages) => pages,
            Err(e) => {
                tracing::warn!(error = %e, "returning free space failed");
                0
            }
        };
        self.checkpoint().await?;
        Ok(Maintenance { pages_returned })
    }
}

impl SqliteStore {
    /// The write-ahead log's size on disk.
    fn wal_len(&self) -> u64 {
        self.wal_path
            .as_deref()
            .and_then(|path| std::fs::metadata(path).ok())
            .map_or(0, |meta| meta.len())
    }

    /// Past its limit, the log is emptied and cut to zero, the caller
    /// holding the writer lock: writes wait for it, and the log stays within
    /// the limit and one write. A failure is logged, not returned: the write
    /// that found the log long goes on.
    pub(super) async fn cut_wal_if_full(&self) {
        if self.wal_len() <= self.wal_limit {
            return;
        }
        let mut conn = self.checkpointer.lock().await;
        if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&mut *conn)
            .await
        {
            tracing::warn!(error = %e, "cannot cut the write-ahead log back");
        }
    }

    /// Moves what the write-ahead log holds into the database file, off
    /// the request path, and keeps the log's size bounded even under
    /// writes that never pause. Part of [`UpkeepStore::maintain`](crate::UpkeepStore::maintain).
    pub async fn checkpoint(&self) -> Result<(), SessionError> {
        {
            let mut conn = self.checkpointer.lock().await;
            sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                .execute(&mut *conn)
                .await?;
        }
        // A passive checkpoint never waits, so under writes that never
        // pause it ends with frames written meanwhile left in the log, and
        // the log is never started over. Taking the writer lock (fair,
        // unlike SQLite's busy wait, which a writer that begins again the
        // moment it commits can win every time) cuts it if it is past its
        // limit, as the next write would.
        drop(self.writer().await?);
        Ok(())
    }

    /// Returns space the database no longer needs (pruned events, dropped
    /// output) to the file system: free pages past [`FREE_BYTES_KEPT`], at
    /// most [`RECLAIM_BYTES`] a call, so no call waits long behind it.
    /// Returns the pages returned. Part of [`UpkeepStore::maintain`](crate::UpkeepStore::maintain).
    pub async fn reclaim(&self) -> Result<u64, SessionError> {
        let page = (self.frame_bytes - super::WAL_FRAME_HEADER) as i64;
        let mut w = self.writer().await?;
        let free: i64 = sqlx::query_scalar("PRAGMA freelist_count")
            .fetch_one(&mut w.conn)
            .await?;
        let pages = (free - FREE_BYTES_KEPT / page).min(RECLAIM_BYTES / page);
        if pages <= 0 {
            return Ok(0);
        }
        sqlx::query(AssertSqlSafe(format!("PRAGMA incremental_vacuum({pages})")))
            .execute(&mut w.conn)
            .await?;
        Ok(pages as u64)
    }
}
