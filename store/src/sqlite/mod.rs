//! [`SqliteStore`]: the embedded store. WAL journal, migrations at open.
//!
//! The store owns its database alone: [`SqliteStore::open`] takes an
//! exclusive lock on the file, so a second service on the same database
//! fails to start instead of corrupting the first one's view. That makes
//! the in-memory [`Ledger`] of sessions exact: every read of a session is
//! served from it, and every write that changes one updates it after its
//! commit, under the writer lock.
//!
//! Every write goes through one writer connection, in a `BEGIN IMMEDIATE`
//! transaction: creates and messages as one batch (`Batched`, one round
//! trip), the others statement by statement (`Tx`). Reads of events, messages and audit use a pool of
//! read-only connections and never wait for the writer (WAL). The writer
//! never checkpoints; [`SqliteStore::checkpoint`] does (part of
//! [`UpkeepStore::maintain`]), on a connection of its own, so no call waits for
//! the WAL's data to reach the database file.
//!
//! Its parts: `ledger` (the sessions in memory, this store's own cache),
//! `open` (the lock, the migrations, the ledger's load),
//! `writer` (taking the writer, `Tx`), `write` (the row's columns,
//! pruning), `batched` (what creates and messages need of it), `ends` (what
//! the ends written once in `ends` need of it), `output` (the
//! output's budgets), `reads` (sessions from the ledger), `lease`
//! and `upkeep` (the WAL, free pages).

mod batched;
mod ends;
mod lease;
mod ledger;
mod open;
mod output;
mod reads;
mod upkeep;
mod write;
mod writer;

use std::{
    fs::File,
    sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard},
};

use sqlx::{SqliteConnection, SqlitePool};
use tokio::sync::{Mutex, watch};

use self::{ledger::Ledger, write::rollback};
use super::OutputBudget;
use crate::{
    error::SessionError,
    model::{SessionId, SessionRow},
};

pub(crate) use self::batched::Batched;
pub(crate) use self::writer::{Tx, any_of, db_now_ms, for_update, retrying, row_order};

/// Default size of the write-ahead log past which a checkpoint makes
/// writers wait while it starts the log over.
pub const WAL_LIMIT: u64 = 64 << 20;
/// Bytes of the header of each frame of the write-ahead log.
const WAL_FRAME_HEADER: u64 = 24;

/// The SQLite store.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    /// Readers.
    pub(crate) pool: SqlitePool,
    /// The one connection every write goes through.
    writer: Arc<Mutex<Writer>>,
    /// The sessions table, in memory.
    ledger: Arc<RwLock<Ledger>>,
    /// The connection that checkpoints the WAL.
    checkpointer: Arc<Mutex<SqliteConnection>>,
    /// Bytes of a frame of the write-ahead log (a page and its header).
    frame_bytes: u64,
    /// Size of the write-ahead log past which a checkpoint restarts it
    /// (see [`SqliteStore::checkpoint`]).
    wal_limit: u64,
    /// The write-ahead log's file (none for an in-memory database).
    wal_path: Option<std::path::PathBuf>,
    /// How much agents' output is kept.
    pub(crate) output_budget: OutputBudget,
    /// Bumped after every commit that wrote events.
    pub(crate) events_written: crate::changes::Changes,
    /// The ledger's count of ended sessions, as last published.
    pub(crate) sessions_ended: watch::Sender<u64>,
    /// Marked at every commit, every shard: one service drives them all.
    pub(crate) work: crate::work::WorkSignal,
    /// The exclusive lock on the database file, held while any clone lives.
    _owner: Arc<Option<File>>,
}

/// The writer connection, and what a write that was cancelled may have left.
#[derive(Debug)]
struct Writer {
    conn: SqliteConnection,
    /// Sessions a write in progress changes. Set before its first statement,
    /// cleared once the ledger has its result: if the write's future is
    /// dropped in between, the next writer rolls back what is open and
    /// rereads these rows, so the ledger never misses a commit.
    unsettled: Vec<SessionId>,
    /// A transaction was opened by a statement of its own
    /// ([`SqliteStore::begin`]) and its batch has not ended it yet: the next
    /// writer rolls it back if the write was cancelled in between.
    open: bool,
}

impl Writer {
    /// Rolls back the transaction [`SqliteStore::begin`] opened, if any.
    async fn abandon(&mut self) {
        if self.open {
            rollback(&mut self.conn).await;
            self.open = false;
        }
    }

    /// `result`, after rolling back the open transaction if it is an error.
    async fn or_abandon<T>(&mut self, result: Result<T, SessionError>) -> Result<T, SessionError> {
        if result.is_err() {
            self.abandon().await;
        }
        result
    }
}

impl SqliteStore {
    /// Wakes the watchers after a commit that wrote events, and those of
    /// ends if it ended sessions.
    pub(super) fn published(&self) {
        self.events_written.mark(crate::shard::ShardSet::ALL);
        self.work.mark(crate::shard::ShardSet::ALL);
        let ended = self.ledger().ended();
        self.sessions_ended.send_if_modified(|n| {
            let changed = *n != ended;
            *n = ended;
            changed
        });
    }

    /// The ledger's row of `session_id` (exact under the writer lock).
    fn ledger_row(&self, session_id: &str) -> Result<SessionRow, SessionError> {
        self.ledger()
            .get(session_id)
            .ok_or_else(|| SessionError::not_found(session_id))
    }

    fn ledger(&self) -> RwLockReadGuard<'_, Ledger> {
        self.ledger.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn ledger_mut(&self) -> RwLockWriteGuard<'_, Ledger> {
        self.ledger.write().unwrap_or_else(PoisonError::into_inner)
    }
}
