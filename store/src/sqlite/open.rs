//! Opening the store: the file lock, the migrations, the writer and
//! checkpointer connections, the read pool, and the ledger loaded from the
//! sessions table.

use std::{
    fs::File,
    str::FromStr,
    sync::{Arc, RwLock},
    time::Duration,
};

use sqlx::{
    Connection, SqliteConnection,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
};
use tokio::sync::{Mutex, watch};

use super::{
    OutputBudget, SqliteStore, WAL_FRAME_HEADER, WAL_LIMIT, Writer,
    ledger::Ledger,
    upkeep,
    write::{entry_from_row, session_columns},
};
use crate::error::SessionError;

impl SqliteStore {
    /// Opens (creating if needed) the database at `url`, runs the
    /// migrations and loads the ledger. Fails if another store holds it.
    pub async fn open(url: &str) -> Result<Self, SessionError> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true)
            // Small pages for a new database (an existing one keeps its
            // own): a create writes about ten pages, most of them a random
            // leaf of a table or index, so the write-ahead log and the
            // checkpoint's writes shrink with the page.
            .page_size(1024);
        let migrating = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await?;
        let owner = claim(options.get_filename())?;
        upkeep::incremental_vacuum_on(&migrating).await?;
        sqlx::migrate!("./migrations/sqlite")
            .run(&migrating)
            .await
            .map_err(|e| SessionError::Internal(format!("migration failed: {e}")))?;
        // Sessions of releases before shards, and their events, take
        // their shards before anything reads them (one process owns the
        // file, so no older release writes more meanwhile).
        {
            let mut conn = migrating.acquire().await?;
            while crate::upkeep::sqlite::fill_shards(&mut conn).await? > 0 {}
        }
        migrating.close().await;
        // The writer never checkpoints: the upkeep task does, every second,
        // on a connection of its own (`checkpointer`), so no call pays for a
        // checkpoint while the log is under its limit.
        let mut writer =
            SqliteConnection::connect_with(&options.clone().pragma("wal_autocheckpoint", "0"))
                .await?;
        // The file lock is ours: whoever held the lease before is gone, so
        // its term ends now rather than when its time runs out.
        sqlx::query("UPDATE leases SET expires_at_ms = 0")
            .execute(&mut writer)
            .await?;
        let mut checkpointer = SqliteConnection::connect_with(&options).await?;
        let page_size: i64 = sqlx::query_scalar("PRAGMA page_size")
            .fetch_one(&mut checkpointer)
            .await?;
        let rows = sqlx::query(concat!("SELECT ", session_columns!(), " FROM sessions"))
            .fetch_all(&mut writer)
            .await?;
        let ledger = Ledger::load(
            rows.iter()
                .map(entry_from_row)
                .collect::<Result<Vec<_>, _>>()?,
        );
        let wal_path = (options.get_filename() != std::path::Path::new(":memory:")).then(|| {
            let mut path = options.get_filename().as_os_str().to_owned();
            path.push("-wal");
            std::path::PathBuf::from(path)
        });
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options.read_only(true))
            .await?;
        let events_written = crate::changes::Changes::default();
        let (sessions_ended, _) = watch::channel(0);
        Ok(SqliteStore {
            pool,
            writer: Arc::new(Mutex::new(Writer {
                conn: writer,
                unsettled: Vec::new(),
                open: false,
            })),
            ledger: Arc::new(RwLock::new(ledger)),
            checkpointer: Arc::new(Mutex::new(checkpointer)),
            frame_bytes: page_size as u64 + WAL_FRAME_HEADER,
            wal_limit: WAL_LIMIT,
            wal_path,
            output_budget: OutputBudget::default(),
            events_written,
            sessions_ended,
            work: crate::work::WorkSignal::default(),
            _owner: Arc::new(owner),
        })
    }

    /// Sets the size of the write-ahead log past which a checkpoint
    /// restarts it ([`WAL_LIMIT`] by default).
    pub fn with_wal_limit(mut self, bytes: u64) -> Self {
        self.wal_limit = bytes;
        self
    }

    /// Sets how much agents' output is kept ([`OutputBudget::default`]
    /// unless set).
    pub fn with_output_budget(mut self, budget: OutputBudget) -> Self {
        self.output_budget = budget;
        self
    }
}

/// Takes the exclusive lock on the database file (none for an in-memory
/// database): a second store on the same file is refused.
fn claim(path: &std::path::Path) -> Result<Option<File>, SessionError> {
    if path == std::path::Path::new(":memory:") {
        return Ok(None);
    }
    let file = File::open(path).map_err(|e| {
        SessionError::Internal(format!("cannot open {} to lock it: {e}", path.display()))
    })?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(SessionError::Internal(format!(
            "database {} is in use by another session service; one service owns a database",
            path.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(SessionError::Internal(format!(
            "cannot lock {}: {e}",
            path.display()
        ))),
    }
}

pub(super) use crate::session_rows::RawSession;
