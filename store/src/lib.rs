//! Troupe's store (crate `troupe-store`), the only crate that speaks to a
//! database: the interface, every read and write of the ledger, and its
//! SQLite and PostgreSQL backends with their migrations. Each write that
//! depends on a check runs the check (a [`crate::policy`] function passed in
//! as a closure) inside the same transaction as the write, so concurrent
//! calls cannot both pass a check that only one of them may pass.
//!
//! [`ConsoleStore`] (the web console's reads and sign-ins) is a part of
//! every store.
//!
//! [`SqliteStore`] is the embedded default; [`PgStore`] keeps the ledger in
//! PostgreSQL for several replicas on one database. The rules never see
//! SQL, so each backend implements this trait without touching them
//! (`shared` holds what both decide alike without I/O). What the trait asks
//! of a backend, beyond its methods:
//!
//! - its errors are [`SessionError::Storage`] of a backend-neutral kind
//!   (`troupe_domain::error`, its `sqlx` feature: the conversion every sqlx backend's `?` uses), so an
//!   unreachable database answers UNAVAILABLE and nothing else leaks;
//! - the values it stores as text (statuses, event kinds, exit reasons,
//!   principals) are parsed once as it reads them ([`parse_stored`]);
//! - what a process change does to a session is
//!   [`crate::policy::process_step`]'s to decide, the backend's to apply;
//! - what a session's end does to its children (their parent-end policies)
//!   is [`crate::policy::parent_end`]'s to decide, and every write that
//!   ends a session (termination, finish, exit, failure) applies it in its
//!   own transaction (`parent_end`: what both backends write alike);
//! - how it keeps its reads fast (SQLite: the in-memory ledger of sessions,
//!   its own) and what upkeep it needs ([`Store::maintain`]) are its own.

mod accounts;
mod agent_rows;
mod backends;
mod budgets;
mod catalog;
mod console;
mod console_rows;
mod creates;
mod ends;
mod groups;
mod inbox;
mod journal;
mod lease;
mod messages;
mod output;
mod parent_end;
mod postgres;
mod process;
mod runners;
mod session_rows;
mod shared;
mod sqlite;
mod trait_impl;
mod writes;

use std::{future::Future, sync::Arc};

/// The domain the store keeps, under the names the service gives it.
pub(crate) use troupe_domain::{agent, error, model, placement, policy};

use tokio::sync::watch;
use troupe_proto::scope::WriteScope;

pub use accounts::{RESERVATION_RELEASE_BATCH, RESERVATION_STALE_AFTER};
pub use budgets::BudgetStore;
pub use catalog::CatalogStore;
pub use console::ConsoleStore;
pub(crate) use console_rows::{ActivityColumns, AuditColumns, MessageColumns, audit_row};
pub use groups::GroupStore;
pub use inbox::InboxStore;
pub use journal::LogStore;
pub use lease::{
    BACKGROUND as BACKGROUND_LEASE, DriverWork, Fence, Holder, Lease, LeaseTiming,
    REQUEST_ID_PRUNE_BATCH,
};
pub use output::OutputBudget;
pub use postgres::{
    EVENTS_LOCK as PG_EVENTS_LOCK, LISTENER_NAME as PG_LISTENER_NAME, POLL_EVERY as PG_POLL_EVERY,
    PgStore, is_postgres_url, redacted_url,
};
pub use sqlite::{SqliteStore, WAL_LIMIT};
pub use writes::{
    Bounds, ChargeCheck, Created, EventPage, FanOut, FanOutCheck, InboxCheck, Maintenance,
    MembersCheck, MessageCheck, RateCheck, RootCheck, Sent, SpawnCheck, TerminateCheck, Throttle,
};

use crate::{
    error::SessionError,
    model::{
        AuditRecord, Failure, FannedOut, Finish, Idempotency, NewMessage, NewSession, Principal,
        ProcessChange, ProcessRow, ProgressReport, RunnerRow, RunnerSpec, SessionId, SessionRow,
        Trust, WorkspaceId,
    },
    placement::Place,
};

/// A write scope as the `writable_paths` column keeps it: a JSON array.
pub(crate) fn scope_text(scope: &WriteScope) -> String {
    serde_json::to_string(&scope.to_strings()).unwrap_or_else(|_| "[]".to_owned())
}

/// Reads the `writable_paths` column back.
pub(crate) fn parse_scope(text: &str) -> Option<WriteScope> {
    let paths: Vec<String> = serde_json::from_str(text).ok()?;
    WriteScope::parse(&paths).ok()
}

pub(crate) use crate::error::parse_stored;

/// The ledger's storage.
pub trait Store:
    BudgetStore
    + ConsoleStore
    + CatalogStore
    + GroupStore
    + InboxStore
    + LogStore
    + Send
    + Sync
    + Clone
    + 'static
{
    /// Inserts a root session (a new tree whose id is the session id's tree).
    fn create_root(
        &self,
        new: NewSession,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        check: RootCheck<'_>,
    ) -> impl Future<Output = Result<Created, SessionError>> + Send;

    /// Inserts a child of `parent_id` if `check` admits it.
    fn create_child(
        &self,
        parent_id: &SessionId,
        new: NewSession,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        check: SpawnCheck<'_>,
    ) -> impl Future<Output = Result<Created, SessionError>> + Send;

    /// Appends a message to `recipient`'s inbox if `check` allows it, the
    /// recipient's inbox takes its bytes and, with a throttle, its sender's
    /// rates do (the rate state updated in the same transaction). Its body
    /// is stored once, beside the inbox entry.
    fn send_message(
        &self,
        recipient: &SessionId,
        message: NewMessage,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        bounds: Bounds<'_>,
        check: MessageCheck<'_>,
    ) -> impl Future<Output = Result<Sent, SessionError>> + Send;

    /// Stores one message to many in one transaction: resolves the
    /// audience's candidates (their rows), lets `check` plan who gets it,
    /// leaves out those whose inbox is full (`bounds.inbox`), counts the
    /// rest against the throttle's rates, stores the body once and appends
    /// a message (its own id, the recipient's next inbox sequence, its
    /// event) to each inbox, with `audit` (its detail: who got what). A group audience's
    /// poster must be a member, else GROUP_NOT_FOUND. With a request id, a
    /// retry replays the whole answer.
    fn fan_out(
        &self,
        out: &FanOut,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        bounds: Bounds<'_>,
        check: FanOutCheck<'_>,
    ) -> impl Future<Output = Result<FannedOut, SessionError>> + Send;

    /// Ends `target` and every active descendant if `check` allows it.
    /// Returns the ids it ended (target first) and the target's new row.
    fn terminate(
        &self,
        target: &SessionId,
        terminated_by: &Principal,
        reason: &str,
        audit: AuditRecord,
        check: TerminateCheck<'_>,
    ) -> impl Future<Output = Result<(Vec<SessionId>, SessionRow), SessionError>> + Send;

    /// Ends `session_id` with its own result if `check` allows it (on the
    /// session as the store has it): status completed or failed as
    /// `finish.outcome` says, end reason `finished`, the result stored, its
    /// end event (with the result), its parent's callback made due (CALLBACK
    /// mode), its process to be stopped no sooner than `stop_after_ms` (ms
    /// since the Unix epoch), every active descendant terminated
    /// (`cascade`, by the session), and `audit`, in one transaction.
    /// Returns the descendants it ended and the session's new row.
    fn finish(
        &self,
        session_id: &SessionId,
        finish: &Finish,
        stop_after_ms: i64,
        audit: AuditRecord,
        check: MessageCheck<'_>,
    ) -> impl Future<Output = Result<(Vec<SessionId>, SessionRow), SessionError>> + Send;

    /// Returns a session's own result, if it finished its task.
    fn finished(
        &self,
        session_id: &SessionId,
    ) -> impl Future<Output = Result<Option<Finish>, SessionError>> + Send;

    fn get_session(
        &self,
        session_id: &SessionId,
    ) -> impl Future<Output = Result<Option<SessionRow>, SessionError>> + Send;

    /// Returns a session's direct children, oldest first.
    fn children(
        &self,
        session_id: &SessionId,
    ) -> impl Future<Output = Result<Vec<SessionRow>, SessionError>> + Send;

    /// Lists a workspace's sessions in creation order, after `after` (a page
    /// token), at most `limit`. Returns the page (rows shared, not copied)
    /// and the next page token.
    fn list_workspace(
        &self,
        workspace_id: &WorkspaceId,
        sandboxed_only: bool,
        include_ended: bool,
        after: i64,
        limit: u32,
    ) -> impl Future<Output = Result<(Vec<Arc<SessionRow>>, Option<i64>), SessionError>> + Send;

    /// Deletes all but the newest `keep` events; returns the highest id
    /// pruned. Background work: refused unless `fence` is the lease's term.
    fn prune_events(
        &self,
        fence: &Fence,
        keep: u64,
    ) -> impl Future<Output = Result<i64, SessionError>> + Send;

    /// Deletes at most `limit` request-id records of callers' calls made
    /// before `before_ms` (ms since the Unix epoch), in one transaction;
    /// returns how many it deleted. Background work: refused unless `fence`
    /// is the lease's term.
    fn prune_request_ids(
        &self,
        fence: &Fence,
        before_ms: i64,
        limit: u32,
    ) -> impl Future<Output = Result<u64, SessionError>> + Send;

    /// Periodic upkeep the backend needs (SQLite: checkpointing its
    /// write-ahead log, returning free pages to the file system), a bounded
    /// amount per call, off the request path; nothing for a backend that
    /// needs none. Called every second by the service.
    fn maintain(&self) -> impl Future<Output = Result<Maintenance, SessionError>> + Send;

    /// Counts the pending or running sessions of each workspace, by trust
    /// level (only the non-zero counts). Metrics read it at every
    /// collection: a backend that answers without waiting is read there
    /// and then (see [`crate::metrics::observe_active`]).
    fn active_counts(
        &self,
    ) -> impl Future<Output = Result<Vec<(WorkspaceId, Trust, u32)>, SessionError>> + Send;

    /// Returns a receiver that changes after every commit that wrote events.
    fn subscribe(&self) -> watch::Receiver<u64>;

    /// Returns a receiver that changes after every commit that ended
    /// sessions (a subset of [`Store::subscribe`]'s).
    fn subscribe_ends(&self) -> watch::Receiver<u64>;

    /// Creates the process record of a session about to start, with the
    /// session's CALLBACK choice, on the runner [`crate::placement::place`]
    /// chooses for its workspace (and places the workspace there), in one
    /// transaction; if it exists, returns the runner it was placed on.
    /// [`Place::Wait`] (nothing written): no runner can take it now.
    fn start_process(
        &self,
        fence: &Fence,
        session_id: &SessionId,
    ) -> impl Future<Output = Result<Place, SessionError>> + Send;

    /// Registers a runner, or renews its lease, until `ttl` from now on the
    /// database's clock; returns its generation, bumped when it registers
    /// after its lease lapsed or under a new endpoint. The embedded
    /// runner's name is refused (INVALID_ARGUMENT).
    fn register_runner(
        &self,
        spec: &RunnerSpec,
        ttl: std::time::Duration,
    ) -> impl Future<Output = Result<i64, SessionError>> + Send;

    /// Returns every runner, with its liveness and active sessions, by name.
    fn runners(&self) -> impl Future<Output = Result<Vec<RunnerRow>, SessionError>> + Send;

    /// Makes `spec` the embedded runner (no lease), removing any other
    /// embedded one; `None` removes it. Background work: fenced.
    fn set_static_runner(
        &self,
        fence: &Fence,
        spec: Option<&RunnerSpec>,
    ) -> impl Future<Output = Result<(), SessionError>> + Send;

    /// Applies runner event `runner_seq` of a session's process, once: the
    /// status it implies (pending to running, running to completed or
    /// failed), its event, the output tail (its last `tail_max` bytes, every
    /// byte as printed), the exit. Output events are kept within the
    /// store's byte budgets (see [`OutputBudget`]). Returns the session after it, or `None` if it was applied before.
    /// Wakes the subscribers even when it wrote no event (an exit after a
    /// termination), so a waiter sees the exit code land. An exit makes the
    /// parent's callback due (CALLBACK mode) in the same transaction.
    fn record_process(
        &self,
        fence: &Fence,
        session_id: &SessionId,
        runner_seq: u64,
        change: ProcessChange,
        tail_max: usize,
    ) -> impl Future<Output = Result<Option<SessionRow>, SessionError>> + Send;

    /// Returns a session's process record.
    fn process(
        &self,
        session_id: &SessionId,
    ) -> impl Future<Output = Result<Option<ProcessRow>, SessionError>> + Send;

    /// Records that messages up to `seq` were written to the agent.
    fn mark_delivered(
        &self,
        fence: &Fence,
        session_id: &SessionId,
        seq: u64,
    ) -> impl Future<Output = Result<(), SessionError>> + Send;

    /// Returns every pending or running session.
    fn active_sessions(&self)
    -> impl Future<Output = Result<Vec<SessionRow>, SessionError>> + Send;

    /// Appends a progress event to an active session's events, with its
    /// audit entry; returns the event's sequence. `check` decides on the
    /// session as the ledger has it, under the writer lock.
    fn record_progress(
        &self,
        session_id: &SessionId,
        report: ProgressReport,
        audit: AuditRecord,
        check: MessageCheck<'_>,
    ) -> impl Future<Output = Result<u64, SessionError>> + Send;

    /// Ends an active session as failed (its process is gone, or could not
    /// be made: `failure` says which) with an audit entry; false if it had
    /// already ended. Ending it makes the parent's callback due.
    fn fail_session(
        &self,
        fence: &Fence,
        session_id: &SessionId,
        failure: Failure,
        detail: &str,
        audit: AuditRecord,
    ) -> impl Future<Output = Result<bool, SessionError>> + Send;

    /// Takes the lease of the background work for `holder` if it is free
    /// or expired (on the database's clock), bumping its epoch; returns the
    /// new term, or `None` while another holder's term is live.
    fn acquire_lease(
        &self,
        holder: &Holder,
        ttl: std::time::Duration,
    ) -> impl Future<Output = Result<Option<Fence>, SessionError>> + Send;

    /// Extends `fence`'s term by `ttl` from now; false if the term is over
    /// (expired or taken over), which its holder cannot undo.
    fn renew_lease(
        &self,
        fence: &Fence,
        ttl: std::time::Duration,
    ) -> impl Future<Output = Result<bool, SessionError>> + Send;

    /// Ends `fence`'s term now (a service that stops), so another takes
    /// the lease without waiting out its time.
    fn release_lease(&self, fence: &Fence)
    -> impl Future<Output = Result<(), SessionError>> + Send;

    /// Returns the lease of the background work as it stands.
    fn lease(&self) -> impl Future<Output = Result<Option<Lease>, SessionError>> + Send;

    /// Ends `session_id` and every active descendant as terminated with
    /// end reason `budget` (by `troupe`), with `audit`, if it is still
    /// active; returns the ids it ended. Background work: fenced.
    fn end_for_budget(
        &self,
        fence: &Fence,
        session_id: &SessionId,
        audit: AuditRecord,
    ) -> impl Future<Output = Result<Vec<SessionId>, SessionError>> + Send;

    /// Returns what the store holds for the background work to do, whoever
    /// recorded it (see [`DriverWork`]).
    fn driver_work(&self) -> impl Future<Output = Result<DriverWork, SessionError>> + Send;

    /// Records that a session's process was asked to stop (or never
    /// started, `unstarted`: then its parent's callback becomes due).
    fn mark_stopped(
        &self,
        fence: &Fence,
        session_id: &SessionId,
        unstarted: bool,
    ) -> impl Future<Output = Result<(), SessionError>> + Send;

    /// Writes the callback notice `message` into the parent's inbox of the
    /// ended session `child_id`, if it is due, and clears it, in one
    /// transaction (with the request-id guard: action `callback`, the
    /// child's id). Returns the message written, or `None` if it was not
    /// due or the parent has ended (then it is cleared all the same).
    fn write_callback(
        &self,
        fence: &Fence,
        child_id: &SessionId,
        message: NewMessage,
        audit: AuditRecord,
    ) -> impl Future<Output = Result<Option<Sent>, SessionError>> + Send;
}
