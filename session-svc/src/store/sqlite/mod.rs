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
//! transaction: the hot ones as one [`Batch`] (one round trip), the others
//! as a [`Write`]. Reads of events, messages and audit use a pool of
//! read-only connections and never wait for the writer (WAL). The writer
//! never checkpoints; [`Store::checkpoint`] does, on a connection of its
//! own, so no call waits for the WAL's data to reach the database file.

mod output;
mod process;
mod upkeep;
mod write;

use std::{
    fs::File,
    str::FromStr,
    sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard},
    time::Duration,
};

use serde_json::json;
use sqlx::{
    Connection, Row, SqliteConnection, SqlitePool,
    sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
    },
};
use tokio::sync::{Mutex, MutexGuard, watch};
use troupe_proto::status::parse_status;
use troupe_telemetry::LifeSpan;

use self::write::{
    Batch, Write, entry_from_row, insert_audit, quota_json, replay, rollback, session_columns,
};
use super::{
    Created, EventPage, MessageCheck, RootCheck, Sent, SpawnCheck, Store, TerminateCheck,
    ledger::Ledger,
};
use crate::{
    error::{QuotaLeft, SessionError},
    model::{
        AuditRecord, AuditRow, EventFilter, EventRow, Failure, Idempotency, NewMessage, NewSession,
        SessionRow, Trust, now_ms,
    },
    policy::SpawnContext,
};

pub use self::output::OutputBudget;

/// Default size of the write-ahead log past which a checkpoint makes
/// writers wait while it starts the log over.
pub const WAL_LIMIT: u64 = 64 << 20;
/// Bytes of the header of each frame of the write-ahead log.
const WAL_FRAME_HEADER: u64 = 24;

/// The SQLite store.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    /// Readers.
    pool: SqlitePool,
    /// The one connection every write goes through.
    writer: Arc<Mutex<Writer>>,
    /// The sessions table, in memory.
    ledger: Arc<RwLock<Ledger>>,
    /// The connection that checkpoints the WAL.
    checkpointer: Arc<Mutex<SqliteConnection>>,
    /// Bytes of a frame of the write-ahead log (a page and its header).
    frame_bytes: u64,
    /// Size of the write-ahead log past which a checkpoint restarts it
    /// (see [`Store::checkpoint`]).
    wal_limit: u64,
    /// The write-ahead log's file (none for an in-memory database).
    wal_path: Option<std::path::PathBuf>,
    /// How much agents' output is kept.
    output_budget: OutputBudget,
    /// Bumped after every commit that wrote events.
    events_written: watch::Sender<u64>,
    /// The ledger's count of ended sessions, as last published.
    sessions_ended: watch::Sender<u64>,
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
    unsettled: Vec<String>,
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

/// How a write that may carry a request id begins.
enum Begun {
    /// An earlier call with the same request id and payload: its result.
    Replay(serde_json::Value),
    /// No earlier call: the batch to fill and commit.
    Batch(Batch),
}

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

    /// Wakes the watchers after a commit that wrote events, and those of
    /// ends if it ended sessions.
    fn published(&self) {
        self.events_written.send_modify(|n| *n = n.wrapping_add(1));
        let ended = self.ledger().ended();
        self.sessions_ended.send_if_modified(|n| {
            let changed = *n != ended;
            *n = ended;
            changed
        });
    }

    fn ledger(&self) -> RwLockReadGuard<'_, Ledger> {
        self.ledger.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn ledger_mut(&self) -> RwLockWriteGuard<'_, Ledger> {
        self.ledger.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the writer, first settling what a cancelled write left, and
    /// cutting the write-ahead log back if it is past its limit.
    async fn writer(&self) -> Result<MutexGuard<'_, Writer>, SessionError> {
        let mut w = self.writer.lock().await;
        self.cut_wal_if_full().await;
        if w.open || !w.unsettled.is_empty() {
            rollback(&mut w.conn).await;
            w.open = false;
            let sql = concat!(
                "SELECT ",
                session_columns!(),
                " FROM sessions WHERE session_id = ?"
            );
            for id in w.unsettled.clone() {
                let row = sqlx::query(sql)
                    .bind(&id)
                    .fetch_optional(&mut w.conn)
                    .await?;
                if let Some((rowid, row)) = row.as_ref().map(entry_from_row).transpose()? {
                    self.ledger_mut().put(rowid, row);
                }
            }
            w.unsettled.clear();
        }
        Ok(w)
    }

    /// Begins a write. With a request id, the transaction opens here and the
    /// earlier call with that id is looked up inside it, so the lookup and
    /// the batch that records the id (or the rule that refuses it) are one
    /// transaction; without one, the batch opens its own and the write stays
    /// one round trip.
    async fn begin(
        &self,
        w: &mut Writer,
        idem: Option<&Idempotency>,
    ) -> Result<Begun, SessionError> {
        let Some(idem) = idem else {
            return Ok(Begun::Batch(Batch::new()));
        };
        w.open = true;
        sqlx::query("BEGIN IMMEDIATE").execute(&mut w.conn).await?;
        let found = replay(&mut w.conn, idem).await;
        match w.or_abandon(found).await? {
            None => Ok(Begun::Batch(Batch::within())),
            Some(result) => {
                w.abandon().await;
                Ok(Begun::Replay(result))
            }
        }
    }

    /// Runs a batch on the writer; it ends the transaction either way. On an
    /// error nothing changed, so nothing is left to settle.
    async fn run_batch(
        &self,
        w: &mut Writer,
        batch: Batch,
    ) -> Result<Vec<SqliteRow>, SessionError> {
        let result = batch.run(&mut w.conn).await;
        w.open = false;
        match result {
            Ok(rows) => Ok(rows),
            Err(e) => {
                w.unsettled.clear();
                Err(e)
            }
        }
    }

    /// Runs a create's batch and puts its results in the ledger: the new
    /// session, its initial message's sequence, the parent's rate state.
    async fn commit_create(
        &self,
        w: &mut Writer,
        batch: Batch,
        new: &NewSession,
        parent_tat: Option<(&str, i64)>,
    ) -> Result<SessionRow, SessionError> {
        w.unsettled = vec![new.session_id.clone()];
        w.unsettled.extend(parent_tat.map(|(id, _)| id.to_owned()));
        let rows = self.run_batch(w, batch).await?;
        let mut rows = rows.iter();
        let (rowid, mut session) = entry_from_row(
            rows.next()
                .ok_or_else(|| SessionError::Internal("insert returned no session".to_owned()))?,
        )?;
        if let Some(seq) = rows.next() {
            session.inbox_seq = seq.try_get(0)?;
        }
        {
            let mut ledger = self.ledger_mut();
            if let Some((parent, tat)) = parent_tat {
                ledger.update(parent, |row| row.spawn_tat_ms = tat);
            }
            ledger.put(rowid, session.clone());
        }
        w.unsettled.clear();
        self.published();
        Ok(session)
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

/// The first column of the first row, as an integer.
fn first_i64(rows: &[SqliteRow]) -> Result<i64, SessionError> {
    let row = rows
        .first()
        .ok_or_else(|| SessionError::Internal("statement returned no row".to_owned()))?;
    Ok(row.try_get(0)?)
}

/// A session row as stored.
#[derive(sqlx::FromRow)]
struct RawSession {
    rowid: i64,
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
}

impl RawSession {
    fn into_row(self) -> Result<SessionRow, SessionError> {
        Ok(SessionRow {
            trust: Trust::from_db(&self.trust_level).ok_or_else(|| {
                SessionError::Internal(format!("bad trust level {:?}", self.trust_level))
            })?,
            status: parse_status(&self.status)
                .ok_or_else(|| SessionError::Internal(format!("bad status {:?}", self.status)))?,
            parent_trust: self.parent_trust_level.as_deref().and_then(Trust::from_db),
            session_id: self.session_id,
            workspace_id: self.workspace_id,
            parent_session_id: self.parent_session_id,
            tree_id: self.tree_id,
            depth: self.depth,
            agent_name: self.agent_name,
            agent_command: self.agent_command,
            title: self.title,
            created_by: self.created_by,
            created_at_ms: self.created_at_ms,
            ended_at_ms: self.ended_at_ms,
            end_reason: self.end_reason,
            spawn_tat_ms: self.spawn_tat_ms,
            inbox_seq: self.inbox_seq,
            trace: match (&self.traceparent, &self.spawn_span_id) {
                (Some(traceparent), Some(spawn)) => LifeSpan::parse(traceparent, spawn),
                _ => None,
            },
        })
    }
}

fn replayed_create(result: serde_json::Value) -> Result<Created, SessionError> {
    let bad = || SessionError::Internal("bad idempotency record".to_owned());
    let session_id = result["session_id"].as_str().ok_or_else(bad)?.to_owned();
    let q = |i: usize| {
        result["quota"][i]
            .as_u64()
            .map(|v| v as u32)
            .ok_or_else(bad)
    };
    Ok(Created::Replayed {
        session_id,
        quota: QuotaLeft {
            tree_sessions_remaining: q(0)?,
            depth_remaining: q(1)?,
            children_remaining: q(2)?,
        },
    })
}

impl Store for SqliteStore {
    async fn create_root(
        &self,
        new: NewSession,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        check: RootCheck<'_>,
    ) -> Result<Created, SessionError> {
        let mut w = self.writer().await?;
        let mut batch = match self.begin(&mut w, idem.as_ref()).await? {
            Begun::Replay(result) => return replayed_create(result),
            Begun::Batch(batch) => batch,
        };
        let quota = check(self.ledger().active_in_workspace(&new.workspace_id));
        let quota = w.or_abandon(quota).await?;
        let tree_id = format!("tree_{}", uuid::Uuid::now_v7().simple());
        batch
            .remember(
                idem.as_ref(),
                json!({"session_id": new.session_id, "quota": quota_json(&quota)}),
            )
            .insert_session(&new, None, &tree_id, 0)
            .audit(&audit);
        let session = self.commit_create(&mut w, batch, &new, None).await?;
        Ok(Created::New {
            session: Box::new(session),
            quota,
        })
    }

    async fn create_child(
        &self,
        parent_id: &str,
        new: NewSession,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        check: SpawnCheck<'_>,
    ) -> Result<Created, SessionError> {
        let mut w = self.writer().await?;
        let mut batch = match self.begin(&mut w, idem.as_ref()).await? {
            Begun::Replay(result) => return replayed_create(result),
            Begun::Batch(batch) => batch,
        };
        let facts = self
            .ledger()
            .spawn_facts(parent_id)
            .ok_or_else(|| SessionError::not_found(parent_id));
        let facts = w.or_abandon(facts).await?;
        let admission = check(&SpawnContext {
            parent: &facts.parent,
            tree_sessions: facts.tree_sessions,
            children: facts.children,
            workspace_active: facts.workspace_active,
            now_ms: now_ms(),
        });
        let admission = w.or_abandon(admission).await?;
        let parent = &facts.parent;
        batch.remember(
            idem.as_ref(),
            json!({"session_id": new.session_id, "quota": quota_json(&admission.quota)}),
        );
        let tat = (admission.parent_spawn_tat_ms != parent.spawn_tat_ms)
            .then_some(admission.parent_spawn_tat_ms);
        if let Some(tat) = tat {
            batch.set_spawn_tat(&parent.session_id, tat);
        }
        batch
            .insert_session(&new, Some(parent), &parent.tree_id, admission.depth)
            .audit(&audit);
        let session = self
            .commit_create(
                &mut w,
                batch,
                &new,
                tat.map(|t| (parent.session_id.as_str(), t)),
            )
            .await?;
        Ok(Created::New {
            session: Box::new(session),
            quota: admission.quota,
        })
    }

    async fn send_message(
        &self,
        recipient: &str,
        message: NewMessage,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        check: MessageCheck<'_>,
    ) -> Result<Sent, SessionError> {
        let mut w = self.writer().await?;
        let mut batch = match self.begin(&mut w, idem.as_ref()).await? {
            Begun::Replay(result) => {
                let bad = || SessionError::Internal("bad idempotency record".to_owned());
                return Ok(Sent {
                    message_id: result["message_id"].as_str().ok_or_else(bad)?.to_owned(),
                    sequence: result["sequence"].as_u64().ok_or_else(bad)?,
                    replayed: true,
                });
            }
            Begun::Batch(batch) => batch,
        };
        let target = self
            .ledger()
            .get(recipient)
            .ok_or_else(|| SessionError::not_found(recipient));
        let target = w.or_abandon(target).await?;
        let checked = check(&target);
        w.or_abandon(checked).await?;
        // The sequence the message will get: the ledger holds the committed
        // inbox_seq and nothing else writes it.
        let sequence = target.inbox_seq as u64 + 1;
        batch
            .remember(
                idem.as_ref(),
                json!({"message_id": message.message_id, "sequence": sequence}),
            )
            .message(&target.session_id, &message)
            .audit(&audit);
        w.unsettled = vec![target.session_id.clone()];
        let rows = self.run_batch(&mut w, batch).await?;
        let stored = first_i64(&rows)? as u64;
        if stored != sequence {
            return Err(SessionError::Internal(format!(
                "inbox sequence {stored} stored where {sequence} was expected"
            )));
        }
        self.ledger_mut()
            .update(recipient, |row| row.inbox_seq = sequence as i64);
        w.unsettled.clear();
        drop(w);
        self.published();
        Ok(Sent {
            message_id: message.message_id,
            sequence,
            replayed: false,
        })
    }

    async fn terminate(
        &self,
        target: &str,
        terminated_by: &str,
        reason: &str,
        audit: AuditRecord,
        check: TerminateCheck<'_>,
    ) -> Result<(Vec<String>, SessionRow), SessionError> {
        let mut w = self.writer().await?;
        let (row, ancestors, subtree) = {
            let ledger = self.ledger();
            let row = ledger
                .get(target)
                .ok_or_else(|| SessionError::not_found(target))?;
            (row, ledger.ancestors(target), ledger.active_subtree(target))
        };
        check(&row, &ancestors)?;
        w.unsettled = subtree.clone();
        let mut tx = Write::begin(&mut w.conn).await?;
        let mut ended = Vec::with_capacity(subtree.len());
        for id in &subtree {
            let why = if id == target { reason } else { "cascade" };
            if let Some(entry) = tx.end_session(id, "terminated", why).await? {
                tx.event(
                    id,
                    "terminated",
                    "terminated",
                    json!({"reason": why, "terminated_by": terminated_by}),
                )
                .await?;
                ended.push(entry);
            }
        }
        let ids: Vec<String> = ended.iter().map(|(_, r)| r.session_id.clone()).collect();
        let mut audit = audit;
        audit.detail = json!({"terminated": ids}).to_string();
        tx.audit(&audit).await?;
        tx.commit().await?;
        let row = {
            let mut ledger = self.ledger_mut();
            for (rowid, row) in ended {
                ledger.put(rowid, row);
            }
            ledger.get(target).unwrap_or(row)
        };
        w.unsettled.clear();
        drop(w);
        self.published();
        Ok((ids, row))
    }

    async fn get_session(&self, session_id: &str) -> Result<Option<SessionRow>, SessionError> {
        Ok(self.ledger().get(session_id))
    }

    async fn children(&self, session_id: &str) -> Result<Vec<SessionRow>, SessionError> {
        Ok(self.ledger().children(session_id))
    }

    async fn inbox_count(&self, session_id: &str) -> Result<u64, SessionError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages WHERE session_id = ?")
            .bind(session_id)
            .fetch_one(&self.pool)
            .await?;
        Ok(n as u64)
    }

    async fn list_workspace(
        &self,
        workspace_id: &str,
        sandboxed_only: bool,
        include_ended: bool,
        after: i64,
        limit: u32,
    ) -> Result<(Vec<Arc<SessionRow>>, Option<i64>), SessionError> {
        Ok(self
            .ledger()
            .list(workspace_id, sandboxed_only, include_ended, after, limit))
    }

    async fn events_after(
        &self,
        filter: &EventFilter,
        after: i64,
        limit: u32,
    ) -> Result<EventPage, SessionError> {
        // One read transaction: the pruning mark and the page come from the same snapshot.
        let mut tx = self.pool.begin().await?;
        let pruned: i64 =
            sqlx::query_scalar("SELECT value FROM meta WHERE key = 'events_pruned_through'")
                .fetch_one(&mut *tx)
                .await?;
        if after > 0 && after < pruned {
            return Ok(EventPage::Expired {
                pruned_through: pruned,
            });
        }
        let rows = sqlx::query(
            "SELECT e.id, e.seq, e.kind, e.status, e.at_ms, e.detail, e.session_id, \
               s.workspace_id, s.parent_session_id, s.parent_trust_level, s.tree_id, s.depth, \
               s.trust_level \
             FROM events e JOIN sessions s ON s.session_id = e.session_id \
             WHERE e.id > ? \
               AND (?2 IS NULL OR e.session_id = ?2) \
               AND (?3 IS NULL OR s.tree_id = ?3) \
               AND (?4 IS NULL OR s.workspace_id = ?4) \
               AND (?5 = 0 OR s.trust_level = 'sandboxed') \
               AND (?6 = 0 OR e.kind IN ('completed', 'failed', 'terminated')) \
             ORDER BY e.id LIMIT ?7",
        )
        .bind(after)
        .bind(filter.session_id.as_deref())
        .bind(filter.tree_id.as_deref())
        .bind(filter.workspace_id.as_deref())
        .bind(filter.sandboxed_only)
        .bind(filter.ends_only)
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let mut events = Vec::with_capacity(rows.len());
        for row in &rows {
            let trust: String = row.try_get("trust_level")?;
            let parent_trust: Option<String> = row.try_get("parent_trust_level")?;
            let depth: i64 = row.try_get("depth")?;
            events.push(EventRow {
                id: row.try_get("id")?,
                seq: row.try_get("seq")?,
                kind: row.try_get("kind")?,
                status: row.try_get("status")?,
                at_ms: row.try_get("at_ms")?,
                detail: row.try_get("detail")?,
                session_id: row.try_get("session_id")?,
                workspace_id: row.try_get("workspace_id")?,
                parent_session_id: row.try_get("parent_session_id")?,
                parent_trust: parent_trust.as_deref().and_then(Trust::from_db),
                tree_id: row.try_get("tree_id")?,
                depth: depth as u32,
                trust: Trust::from_db(&trust)
                    .ok_or_else(|| SessionError::Internal(format!("bad trust level {trust:?}")))?,
            });
        }
        Ok(EventPage::Events(events))
    }

    async fn prune_events(&self, keep: u64) -> Result<i64, SessionError> {
        let mut w = self.writer().await?;
        let mut tx = Write::begin(&mut w.conn).await?;
        let pruned = tx.prune_events(keep).await?;
        tx.commit().await?;
        Ok(pruned)
    }

    async fn checkpoint(&self) -> Result<(), SessionError> {
        self.checkpoint_impl().await
    }

    async fn reclaim(&self) -> Result<u64, SessionError> {
        self.reclaim_impl().await
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.events_written.subscribe()
    }

    fn subscribe_ends(&self) -> watch::Receiver<u64> {
        self.sessions_ended.subscribe()
    }

    fn active_counts(&self) -> Vec<(String, Trust, u32)> {
        self.ledger().active_counts()
    }

    async fn newest_event(&self) -> Result<i64, SessionError> {
        Ok(
            sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM events")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    async fn append_audit(&self, record: AuditRecord) -> Result<(), SessionError> {
        insert_audit(&mut self.writer().await?.conn, &record).await
    }

    async fn list_audit(
        &self,
        session_id: Option<&str>,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<AuditRow>, SessionError> {
        let caller = session_id.map(|id| format!("session:{id}"));
        let rows = sqlx::query(
            "SELECT id, at_ms, caller, action, target, allowed, reason, detail FROM audit \
             WHERE id > ?1 AND (?2 IS NULL OR target = ?2 OR caller = ?3) \
             ORDER BY id LIMIT ?4",
        )
        .bind(after_id)
        .bind(session_id)
        .bind(caller)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(AuditRow {
                    id: row.try_get("id")?,
                    at_ms: row.try_get("at_ms")?,
                    caller: row.try_get("caller")?,
                    action: row.try_get("action")?,
                    target: row.try_get("target")?,
                    allowed: row.try_get("allowed")?,
                    reason: row.try_get("reason")?,
                    detail: row.try_get("detail")?,
                })
            })
            .collect()
    }

    async fn signing_keys(&self) -> Result<Vec<(String, Vec<u8>)>, SessionError> {
        Ok(
            sqlx::query_as("SELECT kid, secret FROM signing_keys ORDER BY created_at_ms DESC, kid")
                .fetch_all(&self.pool)
                .await?,
        )
    }

    async fn add_signing_key(&self, kid: &str, secret: &[u8]) -> Result<(), SessionError> {
        sqlx::query("INSERT INTO signing_keys (kid, secret, created_at_ms) VALUES (?, ?, ?)")
            .bind(kid)
            .bind(secret)
            .bind(now_ms())
            .execute(&mut self.writer().await?.conn)
            .await?;
        Ok(())
    }

    async fn start_process(
        &self,
        session_id: &str,
        notify_parent: bool,
    ) -> Result<(), SessionError> {
        self.start_process_impl(session_id, notify_parent).await
    }

    async fn record_process(
        &self,
        session_id: &str,
        runner_seq: u64,
        change: crate::model::ProcessChange,
        tail_max: usize,
    ) -> Result<Option<SessionRow>, SessionError> {
        self.record_process_impl(session_id, runner_seq, change, tail_max)
            .await
    }

    async fn process(
        &self,
        session_id: &str,
    ) -> Result<Option<crate::model::ProcessRow>, SessionError> {
        self.process_impl(session_id).await
    }

    async fn undelivered(
        &self,
        session_id: &str,
    ) -> Result<Vec<crate::model::InboxMessage>, SessionError> {
        self.undelivered_impl(session_id).await
    }

    async fn received(
        &self,
        session_id: &str,
        limit: u32,
    ) -> Result<Vec<crate::model::ReceivedMessage>, SessionError> {
        self.received_impl(session_id, limit).await
    }

    async fn mark_delivered(&self, session_id: &str, seq: u64) -> Result<(), SessionError> {
        self.mark_delivered_impl(session_id, seq).await
    }

    async fn active_sessions(&self) -> Result<Vec<SessionRow>, SessionError> {
        self.active_sessions_impl().await
    }

    async fn record_progress(
        &self,
        session_id: &str,
        detail: serde_json::Value,
        audit: AuditRecord,
        check: MessageCheck<'_>,
    ) -> Result<u64, SessionError> {
        self.record_progress_impl(session_id, detail, audit, check)
            .await
    }

    async fn fail_session(
        &self,
        session_id: &str,
        failure: Failure,
        detail: &str,
        audit: AuditRecord,
    ) -> Result<bool, SessionError> {
        self.fail_session_impl(session_id, failure, detail, audit)
            .await
    }
}
