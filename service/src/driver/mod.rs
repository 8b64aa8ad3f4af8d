//! The session service's side of the runner (`troupe.runner.v1`): it starts
//! each session's agent, follows the agent's events into the ledger, writes
//! messages to its stdin, stops its process when the session is terminated,
//! and reconciles the two after a restart of either.
//!
//! The ledger stays the authority: the driver only reports what the runner
//! saw (through [`ProcessStore::record_process`], which applies each runner event
//! once, by its sequence), and asks the runner to act on what the ledger
//! decided.
//!
//! An agent's stdin receives one JSON line per message, its initial message
//! first:
//! `{"type":"message","sequence":1,"message_id":"msg_...","sender":"session:sess_...","message":"..."}`.
//!
//! # Who owns which background work
//!
//! Every task the driver spawns is spawned in one of these modules, and
//! ends on the driver's shutdown token or on its own:
//!
//! - `launch`: one task per session being started ([`Driver::launch`]),
//!   which retries the start while the runner is unavailable, until the
//!   session's start deadline, then hands the session to a follower; and
//!   one task per [`Driver::stop`] call, which terminates the listed
//!   processes.
//! - `follow`: one follower per running session (at most one: the
//!   `following` set), which watches the runner's events into the ledger,
//!   re-watching after a lost connection, until the exit is applied.
//! - `deliver`: no task of its own but the short one that records a
//!   delivery while still holding the session's delivery lock.
//! - `notify`: no task: the callback notice to a parent and the failing
//!   of a lost session run in the task that saw the end.
//! - `reconcile`: the pass per runner, which retries until the runner
//!   answers and then hands each active session placed on it to a
//!   follower, a launch or a failure, as `reconcile::decide` says, and
//!   stops the runner's execs whose session is not active.
//! - `owner`: [`Driver::own`], one task for the service's life, which
//!   while it holds shards watches the store's wake-ups for the work any
//!   service recorded in them (`ProcessStore::driver_work`: sessions to
//!   start, messages to deliver, processes to stop, callbacks due, sessions
//!   whose runner was lost) and hands each to one task at a time, in its
//!   shard's term.
//! - `runners`: the runners the store knows (the embedded `--runner` and
//!   those that register), a client of each, and one reconciliation task
//!   per runner for the terms it has not yet reconciled (new shards, or the
//!   runner registered anew).
//!
//! # Runners
//!
//! Each session's process is placed on one runner (`RunnerStore::start_process`,
//! by `crate::placement`), and every call about it (start, watch, stdin,
//! stop) goes to that runner, whose endpoint is the store's.
//!
//! # Ownership
//!
//! The driver acts on a session only in a term of its workspace's shard
//! ([`Term`], from `crate::owner`; [`Terms`] holds this service's): a
//! service that does not hold the shard launches, delivers and stops
//! nothing of it (the shard's owner finds that work in the store). Every
//! store write carries the term's fence; a write refused as fenced ends the
//! term, and so every task of it; every runner call is made only while the
//! term is [`Term::live`].

mod deliver;
mod follow;
mod launch;
mod notify;
mod owner;
mod reconcile;
mod runners;
mod term;

pub use term::{Term, Terms};

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use tonic::{service::interceptor::InterceptedService, transport::Channel};
use troupe_proto::{endpoint::Bearer, runner::runner_service_client::RunnerServiceClient};

use crate::{
    auth::Tokens,
    model::{AuditRecord, Principal, RunnerSpec, SessionId},
    store::Store,
};

/// How long a lost runner connection waits before it is tried again.
const RETRY: Duration = Duration::from_millis(500);

type Client = RunnerServiceClient<InterceptedService<Channel, Bearer>>;

/// Drives agents through the runners.
pub struct Driver<S> {
    store: S,
    tokens: Arc<Tokens>,
    /// The operator token every runner call carries.
    auth: Bearer,
    /// The embedded runner (`--runner`), if any.
    embedded: Option<RunnerSpec>,
    /// Whether other services share the database (PostgreSQL): then one
    /// without `--runner` keeps the embedded runner another recorded.
    shared_database: bool,
    /// The runners as last read from the store, and a client of each.
    runners: Mutex<runners::Fleet>,
    tail_max: usize,
    /// How long after its creation a session's agent may still be started.
    start_deadline: Duration,
    /// Serialises stdin delivery per session, so messages keep their order.
    delivering: Mutex<HashMap<SessionId, Arc<tokio::sync::Mutex<()>>>>,
    /// Sessions whose events are being followed.
    following: Mutex<HashSet<SessionId>>,
    /// Work under way, one task per kind and session at a time.
    busy: Mutex<HashSet<(Job, String)>>,
    /// The terms of the shards this service holds.
    terms: Arc<Terms>,
}

impl<S: Store> Driver<S> {
    /// A driver of the runners the store knows, and of `embedded` (the
    /// `--runner` one), each called with `operator_token`.
    pub fn new(
        store: S,
        tokens: Arc<Tokens>,
        embedded: Option<RunnerSpec>,
        shared_database: bool,
        operator_token: &str,
        tail_max: usize,
        start_deadline: Duration,
    ) -> anyhow::Result<Arc<Self>> {
        let auth = Bearer::new(Some(operator_token))?;
        if let Some(spec) = &embedded {
            troupe_proto::endpoint::connect_lazy(&spec.endpoint)?;
        }
        Ok(Arc::new(Driver {
            store,
            tokens,
            auth,
            embedded,
            shared_database,
            runners: Mutex::new(runners::Fleet::default()),
            tail_max,
            start_deadline,
            delivering: Mutex::new(HashMap::new()),
            following: Mutex::new(HashSet::new()),
            busy: Mutex::new(HashSet::new()),
            terms: Arc::new(Terms::default()),
        }))
    }

    /// The terms of the shards this service holds (the owner's loop keeps
    /// them).
    pub fn terms(&self) -> &Arc<Terms> {
        &self.terms
    }

    /// Claims `(job, id)` for one task; false if one already runs it. The
    /// id is a session's, or a runner's name for `Job::Reconcile`.
    fn claim(&self, job: Job, id: &str) -> bool {
        self.busy
            .lock()
            .expect("poisoned")
            .insert((job, id.to_owned()))
    }

    fn release(&self, job: Job, id: &str) {
        self.busy
            .lock()
            .expect("poisoned")
            .remove(&(job, id.to_owned()));
    }

    /// Whether the session is still pending or running (assumed so when the
    /// ledger cannot be read: the next check decides).
    async fn is_active(&self, session_id: &SessionId) -> bool {
        !matches!(self.store.get_session(session_id).await, Ok(Some(row)) if !row.is_active())
    }
}

/// A kind of work the driver does for one session at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Job {
    Launch,
    Deliver,
    Stop,
    Callback,
    /// Failing a session whose runner was lost.
    Lose,
    /// Reconciling one runner (the id is its name).
    Reconcile,
}

/// An audit record of the driver's own doing.
fn system_audit(
    action: crate::model::Action,
    target: &str,
    allowed: bool,
    detail: &dyn std::fmt::Display,
) -> AuditRecord {
    AuditRecord {
        caller: Principal::Troupe,
        action,
        target: target.to_owned(),
        allowed,
        reason: String::new(),
        detail: detail.to_string(),
    }
}
