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
//! Events are written last in their transaction, under one advisory lock
//! held until commit, so their ids (the watchers' cursors) are handed out in
//! commit order (see `events`). Watchers are woken by local commits, by
//! `LISTEN`, and by polling (see `wake`).
//!
//! Its parts: `open` (connecting, migrations, rows), `locks` (the lock
//! order and the counters), `sessions` (creates, messages), `ends` (what
//! the ends written once in `store::ends` need of it), `process` and
//! `output` (deliveries, progress, the output's budgets), `budgets` (a new
//! session's account), `events` (writing and pruning events), `groups`,
//! `lease`, `runners`, `reads` and `wake`.

#[macro_use]
pub(in crate::store) mod retry;
mod budgets;
mod ends;
mod events;
mod groups;
mod lease;
mod locks;
mod open;
mod output;
mod process;
mod reads;
mod runners;
mod sessions;
mod wake;

pub use self::events::EVENTS_LOCK;
pub use self::open::{is_postgres_url, redacted as redacted_url};
pub use self::wake::{LISTENER_NAME, POLL_EVERY};

use std::{sync::Arc, time::Duration};

pub(in crate::store) use self::retry::retrying;

use sqlx::{PgConnection, PgPool, Postgres, Transaction, pool::PoolConnection};
use tokio::sync::watch;

use super::{
    Bounds, Created, DriverWork, FanOut, FanOutCheck, Fence, Holder, Lease, Maintenance,
    MessageCheck, OutputBudget, RESERVATION_RELEASE_BATCH, RESERVATION_STALE_AFTER, RootCheck,
    Sent, SpawnCheck, Store, TerminateCheck,
};
use crate::{
    error::SessionError,
    model::{
        AuditRecord, Failure, FannedOut, Finish, Idempotency, NewMessage, NewSession, Principal,
        ProcessChange, ProcessRow, RunnerRow, RunnerSpec, SessionRow, Trust, now_ms,
    },
    placement::Place,
};

/// Connections each replica keeps to the database.
pub const POOL_SIZE: u32 = 10;

/// The PostgreSQL store.
#[derive(Clone, Debug)]
pub struct PgStore {
    pub(in crate::store) pool: PgPool,
    /// How much agents' output is kept.
    output_budget: OutputBudget,
    /// Bumped after every commit that wrote events, here or elsewhere.
    events_written: watch::Sender<u64>,
    /// Bumped after every commit that ended sessions, here or elsewhere.
    sessions_ended: watch::Sender<u64>,
    /// Stops the listener and the poller when the last clone goes.
    _tasks: Arc<wake::Tasks>,
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

    /// Begins a write transaction (see `store::backends`).
    pub(in crate::store) async fn tx(&self) -> Result<Tx<'_>, SessionError> {
        Ok(Tx {
            tx: self.begin().await?,
            store: self,
        })
    }

    /// A pooled connection, for a write of one statement.
    pub(in crate::store) async fn write_conn(
        &self,
    ) -> Result<PoolConnection<Postgres>, SessionError> {
        Ok(self.pool.acquire().await?)
    }

    /// Appends `events`, last in their transaction (see `events::write`).
    pub(in crate::store) async fn append_events(
        conn: &mut PgConnection,
        events: &[events::NewEvent],
        ended: bool,
    ) -> Result<(), SessionError> {
        events::write(conn, events, ended).await.map(drop)
    }

    /// Wakes the local watchers after a commit (and those of ends, if it
    /// `ended` sessions).
    pub(in crate::store) fn committed(&self, ended: bool) {
        self.published(ended);
    }

    /// Wakes the local watchers after a commit.
    fn published(&self, ended: bool) {
        self.events_written.send_modify(|n| *n = n.wrapping_add(1));
        if ended {
            self.sessions_ended.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

/// A write transaction, for code written once for both backends (see
/// `store::backends`); dropped before its commit, it rolls back.
pub(in crate::store) struct Tx<'s> {
    tx: Transaction<'static, Postgres>,
    pub(super) store: &'s PgStore,
}

impl Tx<'_> {
    /// The transaction's connection.
    pub(in crate::store) fn conn(&mut self) -> &mut PgConnection {
        &mut self.tx
    }

    pub(in crate::store) async fn commit(self) -> Result<(), SessionError> {
        Ok(self.tx.commit().await?)
    }
}

/// "In the JSON array of texts bound as parameter `$n`", in PostgreSQL's
/// words.
macro_rules! ids_in {
    ($n:literal) => {
        concat!("(SELECT json_array_elements_text(CAST($", $n, " AS json)))")
    };
}
pub(in crate::store) use ids_in;

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
pub(in crate::store) use for_update;

impl Store for PgStore {
    async fn create_root(
        &self,
        new: NewSession,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        check: RootCheck<'_>,
    ) -> Result<Created, SessionError> {
        let created = retrying!(self.create_root_once(&new, idem.as_ref(), &audit, check))?;
        if matches!(created, Created::New { .. }) {
            self.published(false);
        }
        Ok(created)
    }

    async fn create_child(
        &self,
        parent_id: &str,
        new: NewSession,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        check: SpawnCheck<'_>,
    ) -> Result<Created, SessionError> {
        let created =
            retrying!(self.create_child_once(parent_id, &new, idem.as_ref(), &audit, check))?;
        if matches!(created, Created::New { .. }) {
            self.published(false);
        }
        Ok(created)
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
        let sent = retrying!(self.send_message_once(
            recipient,
            &message,
            idem.as_ref(),
            &audit,
            bounds,
            check
        ))?;
        if !sent.replayed {
            self.published(false);
        }
        Ok(sent)
    }

    async fn fan_out(
        &self,
        out: &FanOut,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        bounds: Bounds<'_>,
        check: FanOutCheck<'_>,
    ) -> Result<FannedOut, SessionError> {
        let done = retrying!(self.fan_out_once(out, idem.as_ref(), &audit, bounds, check))?;
        if !done.replayed {
            self.published(false);
        }
        Ok(done)
    }

    async fn terminate(
        &self,
        target: &str,
        terminated_by: &Principal,
        reason: &str,
        audit: AuditRecord,
        check: TerminateCheck<'_>,
    ) -> Result<(Vec<String>, SessionRow), SessionError> {
        retrying!(self.terminate_once(target, terminated_by, reason, &audit, check))
    }

    async fn finish(
        &self,
        session_id: &str,
        finish: &Finish,
        stop_after_ms: i64,
        audit: AuditRecord,
        check: MessageCheck<'_>,
    ) -> Result<(Vec<String>, SessionRow), SessionError> {
        retrying!(self.finish_once(session_id, finish, stop_after_ms, &audit, check))
    }

    async fn finished(&self, session_id: &str) -> Result<Option<Finish>, SessionError> {
        self.finished_impl(session_id).await
    }

    async fn get_session(&self, session_id: &str) -> Result<Option<SessionRow>, SessionError> {
        self.get_session_impl(session_id).await
    }

    async fn children(&self, session_id: &str) -> Result<Vec<SessionRow>, SessionError> {
        self.children_impl(session_id).await
    }

    async fn list_workspace(
        &self,
        workspace_id: &str,
        sandboxed_only: bool,
        include_ended: bool,
        after: i64,
        limit: u32,
    ) -> Result<(Vec<Arc<SessionRow>>, Option<i64>), SessionError> {
        self.list_workspace_impl(workspace_id, sandboxed_only, include_ended, after, limit)
            .await
    }

    async fn prune_events(&self, fence: &Fence, keep: u64) -> Result<i64, SessionError> {
        retrying!(self.prune_events_once(fence, keep))
    }

    async fn prune_request_ids(
        &self,
        fence: &Fence,
        before_ms: i64,
        limit: u32,
    ) -> Result<u64, SessionError> {
        retrying!(self.prune_request_ids_once(fence, before_ms, limit))
    }

    async fn maintain(&self) -> Result<Maintenance, SessionError> {
        // PostgreSQL checkpoints by itself, and autovacuum returns what
        // pruning frees. Stale reservations are released, each in its own
        // transaction (any replica may; SKIP LOCKED keeps them apart).
        let before = now_ms().saturating_sub(RESERVATION_STALE_AFTER.as_millis() as i64);
        let released =
            super::BudgetStore::release_stale_reservations(self, before, RESERVATION_RELEASE_BATCH)
                .await?;
        if released > 0 {
            tracing::warn!(released, "stale model-call reservations released");
        }
        Ok(Maintenance::default())
    }

    async fn end_for_budget(
        &self,
        fence: &Fence,
        session_id: &str,
        audit: AuditRecord,
    ) -> Result<Vec<String>, SessionError> {
        retrying!(self.end_for_budget_once(fence, session_id, &audit))
    }

    async fn active_counts(&self) -> Result<Vec<(String, Trust, u32)>, SessionError> {
        self.active_counts_impl().await
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.events_written.subscribe()
    }

    fn subscribe_ends(&self) -> watch::Receiver<u64> {
        self.sessions_ended.subscribe()
    }

    async fn start_process(&self, fence: &Fence, session_id: &str) -> Result<Place, SessionError> {
        retrying!(self.start_process_once(fence, session_id))
    }

    async fn register_runner(&self, spec: &RunnerSpec, ttl: Duration) -> Result<i64, SessionError> {
        retrying!(self.register_runner_once(spec, ttl))
    }

    async fn runners(&self) -> Result<Vec<RunnerRow>, SessionError> {
        self.runners_impl().await
    }

    async fn set_static_runner(
        &self,
        fence: &Fence,
        spec: Option<&RunnerSpec>,
    ) -> Result<(), SessionError> {
        retrying!(self.set_static_runner_once(fence, spec))
    }

    async fn record_process(
        &self,
        fence: &Fence,
        session_id: &str,
        runner_seq: u64,
        change: ProcessChange,
        tail_max: usize,
    ) -> Result<Option<SessionRow>, SessionError> {
        retrying!(self.record_process_once(fence, session_id, runner_seq, &change, tail_max))
    }

    async fn process(&self, session_id: &str) -> Result<Option<ProcessRow>, SessionError> {
        self.process_impl(session_id).await
    }

    async fn mark_delivered(
        &self,
        fence: &Fence,
        session_id: &str,
        seq: u64,
    ) -> Result<(), SessionError> {
        if retrying!(self.mark_delivered_once(fence, session_id, seq))? {
            self.published(false);
        }
        Ok(())
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
        let seq = retrying!(self.record_progress_once(session_id, &detail, &audit, check))?;
        self.published(false);
        Ok(seq)
    }

    async fn fail_session(
        &self,
        fence: &Fence,
        session_id: &str,
        failure: Failure,
        detail: &str,
        audit: AuditRecord,
    ) -> Result<bool, SessionError> {
        retrying!(self.fail_session_once(fence, session_id, failure, detail, &audit))
    }

    async fn acquire_lease(
        &self,
        holder: &Holder,
        ttl: std::time::Duration,
    ) -> Result<Option<Fence>, SessionError> {
        retrying!(self.acquire_lease_impl(holder, ttl))
    }

    async fn renew_lease(
        &self,
        fence: &Fence,
        ttl: std::time::Duration,
    ) -> Result<bool, SessionError> {
        retrying!(self.renew_lease_impl(fence, ttl))
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

    async fn mark_stopped(
        &self,
        fence: &Fence,
        session_id: &str,
        unstarted: bool,
    ) -> Result<(), SessionError> {
        retrying!(self.mark_stopped_once(fence, session_id, unstarted))
    }

    async fn write_callback(
        &self,
        fence: &Fence,
        child_id: &str,
        message: NewMessage,
        audit: AuditRecord,
    ) -> Result<Option<Sent>, SessionError> {
        let sent = retrying!(self.write_callback_once(fence, child_id, &message, &audit))?;
        if sent.is_some() {
            self.published(false);
        }
        Ok(sent)
    }
}
