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
use troupe_proto::status::parse_status;
use troupe_telemetry::LifeSpan;

use super::{
    OutputBudget, SqliteStore, WAL_FRAME_HEADER, WAL_LIMIT, Writer,
    ledger::Ledger,
    upkeep,
    write::{entry_from_row, session_columns},
};
use crate::{
    error::SessionError,
    model::{ParentEnd, Principal, SessionRow, Trust},
    store::{parse_scope, parse_stored},
};

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
        let (events_written, _) = watch::channel(0);
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

/// A session row as stored.
#[derive(sqlx::FromRow)]
pub(super) struct RawSession {
    pub(super) rowid: i64,
    session_id: String,
    workspace_id: String,
    parent_session_id: Option<String>,
    parent_trust_level: Option<String>,
    tree_id: String,
    depth: u32,
    trust_level: String,
    agent_name: String,
    agent_command: String,
    title: String,
    status: String,
    created_by: String,
    created_at_ms: i64,
    ended_at_ms: Option<i64>,
    end_reason: Option<String>,
    spawn_tat_ms: i64,
    inbox_seq: i64,
    traceparent: Option<String>,
    spawn_span_id: Option<String>,
    writable_paths: String,
    on_parent_end: String,
    orphaned: bool,
}

impl RawSession {
    pub(super) fn into_row(self) -> Result<SessionRow, SessionError> {
        Ok(SessionRow {
            trust: parse_stored("trust level", &self.trust_level, Trust::from_db)?,
            status: parse_stored("status", &self.status, parse_status)?,
            parent_trust: self
                .parent_trust_level
                .as_deref()
                .map(|t| parse_stored("trust level", t, Trust::from_db))
                .transpose()?,
            session_id: self.session_id,
            workspace_id: self.workspace_id,
            parent_session_id: self.parent_session_id,
            tree_id: self.tree_id,
            depth: self.depth,
            agent_name: self.agent_name,
            agent_command: self.agent_command,
            title: self.title,
            created_by: parse_stored("creator", &self.created_by, Principal::parse)?,
            created_at_ms: self.created_at_ms,
            ended_at_ms: self.ended_at_ms,
            end_reason: self.end_reason,
            spawn_tat_ms: self.spawn_tat_ms,
            inbox_seq: self.inbox_seq,
            trace: match (&self.traceparent, &self.spawn_span_id) {
                (Some(traceparent), Some(spawn)) => LifeSpan::parse(traceparent, spawn),
                _ => None,
            },
            write_scope: parse_stored("write scope", &self.writable_paths, parse_scope)?,
            on_parent_end: parse_stored(
                "parent-end policy",
                &self.on_parent_end,
                ParentEnd::parse,
            )?,
            orphaned: self.orphaned,
        })
    }
}
