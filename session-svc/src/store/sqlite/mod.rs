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
//! never checkpoints; [`SqliteStore::checkpoint`] does (part of
//! [`Store::maintain`]), on a connection of its own, so no call waits for
//! the WAL's data to reach the database file.
//!
//! Its parts: `ledger` (the sessions in memory, this store's own cache),
//! `open` (the lock, the migrations, the ledger's load),
//! `writer` (taking the writer, beginning and running a write), `write`
//! (the statements), `sessions` (creates, messages), `ends` (what the
//! ends written once in `store::ends` need of it), `process` and `output`
//! (deliveries, progress, the output's budgets), `groups`, `lease`,
//! `runners` and `upkeep` (the WAL, free pages).

mod ends;
mod groups;
mod lease;
mod ledger;
mod open;
mod output;
mod process;
mod runners;
mod sessions;
mod upkeep;
mod write;
mod writer;

use std::{
    fs::File,
    sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard},
    time::Duration,
};

use sqlx::{SqliteConnection, SqlitePool};
use tokio::sync::{Mutex, watch};

use self::{
    ledger::Ledger,
    write::{Write, rollback},
};
use super::{
    Bounds, Created, DriverWork, FanOut, FanOutCheck, Fence, Holder, Lease, Maintenance,
    MessageCheck, RootCheck, Sent, SpawnCheck, Store, TerminateCheck,
};
use crate::{
    error::SessionError,
    model::{
        AuditRecord, Failure, FannedOut, Finish, Idempotency, NewMessage, NewSession, Principal,
        RunnerRow, RunnerSpec, SessionRow, Trust,
    },
    placement::Place,
};

pub use self::output::OutputBudget;
pub(in crate::store) use self::writer::{Tx, for_update, ids_in, retrying};

/// Default size of the write-ahead log past which a checkpoint makes
/// writers wait while it starts the log over.
pub const WAL_LIMIT: u64 = 64 << 20;
/// Bytes of the header of each frame of the write-ahead log.
const WAL_FRAME_HEADER: u64 = 24;

/// The SQLite store.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    /// Readers.
    pub(in crate::store) pool: SqlitePool,
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

impl SqliteStore {
    /// Wakes the watchers after a commit that wrote events, and those of
    /// ends if it ended sessions.
    pub(super) fn published(&self) {
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
}

impl Store for SqliteStore {
    async fn create_root(
        &self,
        new: NewSession,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        check: RootCheck<'_>,
    ) -> Result<Created, SessionError> {
        self.create_root_impl(new, idem, audit, check).await
    }

    async fn create_child(
        &self,
        parent_id: &str,
        new: NewSession,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        check: SpawnCheck<'_>,
    ) -> Result<Created, SessionError> {
        self.create_child_impl(parent_id, new, idem, audit, check)
            .await
    }

    async fn send_message(
        &self,
        recipient: &str,
        message: NewMessage,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        bounds: Bounds<'_>,
        check: MessageCheck<'_>,
    ) -> Result<Sent, SessionError> {
        self.send_message_impl(recipient, message, idem, audit, bounds, check)
            .await
    }

    async fn fan_out(
        &self,
        out: &FanOut,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        bounds: Bounds<'_>,
        check: FanOutCheck<'_>,
    ) -> Result<FannedOut, SessionError> {
        self.fan_out_impl(out, idem, audit, bounds, check).await
    }

    async fn terminate(
        &self,
        target: &str,
        terminated_by: &Principal,
        reason: &str,
        audit: AuditRecord,
        check: TerminateCheck<'_>,
    ) -> Result<(Vec<String>, SessionRow), SessionError> {
        self.terminate_once(target, terminated_by, reason, &audit, check)
            .await
    }

    async fn finish(
        &self,
        session_id: &str,
        finish: &Finish,
        stop_after_ms: i64,
        audit: AuditRecord,
        check: MessageCheck<'_>,
    ) -> Result<(Vec<String>, SessionRow), SessionError> {
        self.finish_once(session_id, finish, stop_after_ms, &audit, check)
            .await
    }

    async fn finished(&self, session_id: &str) -> Result<Option<Finish>, SessionError> {
        self.finished_impl(session_id).await
    }

    async fn get_session(&self, session_id: &str) -> Result<Option<SessionRow>, SessionError> {
        Ok(self.ledger().get(session_id))
    }

    async fn children(&self, session_id: &str) -> Result<Vec<SessionRow>, SessionError> {
        Ok(self.ledger().children(session_id))
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

    async fn prune_events(&self, fence: &Fence, keep: u64) -> Result<i64, SessionError> {
        let mut w = self.writer().await?;
        let mut tx = Write::begin(&mut w.conn).await?;
        lease::check(tx.conn(), fence).await?;
        let pruned = tx.prune_events(keep).await?;
        tx.commit().await?;
        Ok(pruned)
    }

    async fn prune_request_ids(
        &self,
        fence: &Fence,
        before_ms: i64,
        limit: u32,
    ) -> Result<u64, SessionError> {
        let mut w = self.writer().await?;
        let mut tx = Write::begin(&mut w.conn).await?;
        lease::check(tx.conn(), fence).await?;
        let pruned = tx.prune_request_ids(before_ms, limit).await?;
        tx.commit().await?;
        Ok(pruned)
    }

    async fn maintain(&self) -> Result<Maintenance, SessionError> {
        self.maintain_impl().await
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.events_written.subscribe()
    }

    fn subscribe_ends(&self) -> watch::Receiver<u64> {
        self.sessions_ended.subscribe()
    }

    async fn active_counts(&self) -> Result<Vec<(String, Trust, u32)>, SessionError> {
        Ok(self.ledger().active_counts())
    }

    async fn start_process(&self, fence: &Fence, session_id: &str) -> Result<Place, SessionError> {
        self.start_process_impl(fence, session_id).await
    }

    async fn register_runner(&self, spec: &RunnerSpec, ttl: Duration) -> Result<i64, SessionError> {
        self.register_runner_impl(spec, ttl).await
    }

    async fn runners(&self) -> Result<Vec<RunnerRow>, SessionError> {
        self.runners_impl().await
    }

    async fn set_static_runner(
        &self,
        fence: &Fence,
        spec: Option<&RunnerSpec>,
    ) -> Result<(), SessionError> {
        self.set_static_runner_impl(fence, spec).await
    }

    async fn record_process(
        &self,
        fence: &Fence,
        session_id: &str,
        runner_seq: u64,
        change: crate::model::ProcessChange,
        tail_max: usize,
    ) -> Result<Option<SessionRow>, SessionError> {
        self.record_process_once(fence, session_id, runner_seq, &change, tail_max)
            .await
    }

    async fn process(
        &self,
        session_id: &str,
    ) -> Result<Option<crate::model::ProcessRow>, SessionError> {
        self.process_impl(session_id).await
    }

    async fn mark_delivered(
        &self,
        fence: &Fence,
        session_id: &str,
        seq: u64,
    ) -> Result<(), SessionError> {
        self.mark_delivered_impl(fence, session_id, seq).await
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
        fence: &Fence,
        session_id: &str,
        failure: Failure,
        detail: &str,
        audit: AuditRecord,
    ) -> Result<bool, SessionError> {
        self.fail_session_once(fence, session_id, failure, detail, &audit)
            .await
    }

    async fn acquire_lease(
        &self,
        holder: &Holder,
        ttl: std::time::Duration,
    ) -> Result<Option<Fence>, SessionError> {
        self.acquire_lease_impl(holder, ttl).await
    }

    async fn renew_lease(
        &self,
        fence: &Fence,
        ttl: std::time::Duration,
    ) -> Result<bool, SessionError> {
        self.renew_lease_impl(fence, ttl).await
    }

    async fn release_lease(&self, fence: &Fence) -> Result<(), SessionError> {
        self.release_lease_impl(fence).await
    }

    async fn lease(&self) -> Result<Option<Lease>, SessionError> {
        self.lease_impl().await
    }

    async fn driver_work(&self) -> Result<DriverWork, SessionError> {
        self.driver_work_impl().await
    }

    async fn end_for_budget(
        &self,
        fence: &Fence,
        session_id: &str,
        audit: AuditRecord,
    ) -> Result<Vec<String>, SessionError> {
        self.end_for_budget_once(fence, session_id, &audit).await
    }

    async fn mark_stopped(
        &self,
        fence: &Fence,
        session_id: &str,
        unstarted: bool,
    ) -> Result<(), SessionError> {
        self.mark_stopped_impl(fence, session_id, unstarted).await
    }

    async fn write_callback(
        &self,
        fence: &Fence,
        child_id: &str,
        message: NewMessage,
        audit: AuditRecord,
    ) -> Result<Option<Sent>, SessionError> {
        self.write_callback_impl(fence, child_id, message, audit)
            .await
    }
}
