//! [`PgStore`]: the PostgreSQL store, for several session services
//! ("replicas") on one database.
//!
//! Nothing is held in memory that another replica could change: every read
//! is a query, and every check-then-write runs in one transaction that first
//! locks the rows the check reads, always in the same order (see `locks`):
//! the workspace's counter row, then the tree's, then session rows. A write
//! that ends sessions takes the same locks, in the same order, and keeps the
//! counters true. A transaction that still loses a deadlock or a
//! serialization check is run again (`retrying!`). Every transaction
//! starts in `PgStore::begin`, whose `BEGIN` runs in a task of its own
//! (sqlx's is not cancel-safe), so a write dropped midway leaves no pooled
//! connection inside a transaction.
//!
//! Events are written last in their transaction, under their shard's row
//! of `event_shards`, held until commit, so each shard's positions (the
//! watchers' cursors) are handed out in commit order, and commits of
//! different shards share no lock (see `events`). Watchers and drivers are
//! woken by counters read after local commits, on `LISTEN` and by polling
//! (see `wake`).
//!
//! Its parts: `open` (connecting, migrations, rows), `locks` (the lock
//! order and the counters), `batched` (what creates and messages need of
//! it), `ends` (what the ends written once in `ends` need of it),
//! `output` (the output's budgets), `events` (writing and pruning events),
//! `lease`, `reads` and `wake`.

#[macro_use]
pub(crate) mod retry;
mod batched;
mod ends;
mod events;
mod lease;
mod locks;
mod open;
mod output;
mod reads;
mod wake;

pub use self::open::{is_postgres_url, redacted as redacted_url};
pub use self::wake::{LISTENER_NAME, POLL_EVERY};

use std::sync::Arc;

pub(crate) use self::batched::Batched;
pub(crate) use self::retry::retrying;

use sqlx::{PgConnection, PgPool, Postgres, Transaction, pool::PoolConnection};
use tokio::sync::watch;

use super::OutputBudget;
use crate::error::SessionError;

/// Connections each replica keeps to the database.
pub const POOL_SIZE: u32 = 10;

/// The PostgreSQL store.
#[derive(Clone, Debug)]
pub struct PgStore {
    pub(crate) pool: PgPool,
    /// How much agents' output is kept.
    pub(crate) output_budget: OutputBudget,
    /// Each shard's changes, after commits here or elsewhere (`wake`).
    pub(crate) events_written: crate::changes::Changes,
    /// Bumped after every commit that ended sessions, here or elsewhere.
    pub(crate) sessions_ended: watch::Sender<u64>,
    /// The shards commits here or elsewhere may have made work in.
    pub(crate) work: crate::work::WorkSignal,
    /// The listener and the reader of the shards' counters (prompted after
    /// each commit here); they stop when the last clone goes.
    tasks: Arc<wake::Tasks>,
}

impl PgStore {
    /// Opens a transaction on a connection of the pool; every write's
    /// transaction starts here. sqlx's `Pool::begin` is not cancel-safe on
    /// PostgreSQL: a caller dropped while `BEGIN` is on the wire leaves the
    /// server inside a transaction that nothing rolls back, and the pool
    /// hands that connection out again. Later statements of any caller then
    /// run inside it, keep its locks (a lease row locked so blocks every
    /// fenced write) and keep it from ever sitting idle long enough for
    /// `IDLE_IN_TRANSACTION` to end it. So `BEGIN` runs in a task of its
    /// own, which always sees its answer: a transaction whose caller went
    /// away meanwhile is dropped there, which rolls it back.
    pub(super) async fn begin(&self) -> Result<Transaction<'static, Postgres>, SessionError> {
        let pool = self.pool.clone();
        match tokio::spawn(async move { pool.begin().await }).await {
            Ok(tx) => Ok(tx?),
            Err(e) => Err(SessionError::Internal(format!(
                "opening a transaction failed: {e}"
            ))),
        }
    }

    /// Begins a write transaction (see `backends`).
    pub(crate) async fn tx(&self) -> Result<Tx<'_>, SessionError> {
        Ok(Tx {
            tx: self.begin().await?,
            _store: self,
        })
    }

    /// A pooled connection, for a write of one statement.
    pub(crate) async fn write_conn(&self) -> Result<PoolConnection<Postgres>, SessionError> {
        Ok(self.pool.acquire().await?)
    }

    /// Appends `events`, last in their transaction (see `events::write`);
    /// returns each one's sequence in its session's events.
    pub(crate) async fn append_events(
        conn: &mut PgConnection,
        events: &[events::NewEvent],
        ended: bool,
    ) -> Result<Vec<i64>, SessionError> {
        let written = events::write(conn, events, ended).await?;
        Ok(written.into_iter().map(|(_, seq)| seq).collect())
    }

    /// Marks `session_id`'s shard as changed by a commit that writes no
    /// event (see `events::touch`).
    pub(crate) async fn touch(
        conn: &mut PgConnection,
        session_id: &str,
    ) -> Result<(), SessionError> {
        events::touch(conn, session_id).await
    }

    /// Has the changes a commit made read, which wakes the watchers and
    /// drivers of the shards it moved, here and on the other replicas
    /// (`wake`); `_ended` is for SQLite, which has no counters to read.
    pub(crate) fn committed(&self, _ended: bool) {
        self.tasks.committed();
    }
}

/// A write transaction, for code written once for both backends (see
/// `backends`); dropped before its commit, it rolls back.
pub(crate) struct Tx<'s> {
    tx: Transaction<'static, Postgres>,
    /// Borrowed as SQLite's `Tx` borrows its store, so that code written
    /// once names one `Tx<'_>`.
    _store: &'s PgStore,
}

impl Tx<'_> {
    /// The transaction's connection.
    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        &mut self.tx
    }

    pub(crate) async fn commit(self) -> Result<(), SessionError> {
        Ok(self.tx.commit().await?)
    }
}

/// "Is one of the JSON array of texts bound as parameter `$n`", in
/// PostgreSQL's words: the right-hand side of a predicate on a column. An
/// array it compares with `= ANY`, so the column's index serves it in a
/// generic plan too (`IN (SELECT json_array_elements_text(..))` estimates
/// a hundred rows, and past a few thousand rows a generic plan scans the
/// whole table instead).
macro_rules! any_of {
    ($n:literal) => {
        concat!(
            "= ANY(ARRAY(SELECT json_array_elements_text(CAST($",
            $n,
            " AS json))))"
        )
    };
}
pub(crate) use any_of;

/// Locks the rows a `SELECT` reads until the transaction ends: ` FOR
/// UPDATE`, or ` FOR` and the lock given.
macro_rules! for_update {
    () => {
        " FOR UPDATE"
    };
    ($lock:literal) => {
        concat!(" FOR ", $lock)
    };
}
pub(crate) use for_update;

/// The database's clock, in milliseconds since the Unix epoch, in
/// PostgreSQL's words (the clock's time now, not the transaction's start).
macro_rules! db_now_ms {
    () => {
        "CAST(extract(epoch FROM clock_timestamp()) * 1000 AS BIGINT)"
    };
}
pub(crate) use db_now_ms;

/// The column that orders sessions by creation, in PostgreSQL's words.
macro_rules! row_order {
    () => {
        "row_id"
    };
}
pub(crate) use row_order;
