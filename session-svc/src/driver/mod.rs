//! The session service's side of the runner (`troupe.runner.v1`): it starts
//! each session's agent, follows the agent's events into the ledger, writes
//! messages to its stdin, stops its process when the session is terminated,
//! and reconciles the two after a restart of either.
//!
//! The ledger stays the authority: the driver only reports what the runner
//! saw (through [`Store::record_process`], which applies each runner event
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
//! - `reconcile`: the pass at start ([`Driver::reconcile`], run by the
//!   service in a task of its own), which retries until the runner answers
//!   and then hands each session to a follower, a launch, a failure or a
//!   stop, as `reconcile::decide` says.

mod deliver;
mod follow;
mod launch;
mod notify;
mod reconcile;

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio_util::sync::CancellationToken;
use tonic::{service::interceptor::InterceptedService, transport::Channel};
use troupe_proto::{endpoint::Bearer, runner::runner_service_client::RunnerServiceClient};

use crate::{
    auth::Tokens,
    model::{AuditRecord, Principal},
    store::Store,
};

/// How long a lost runner connection waits before it is tried again.
const RETRY: Duration = Duration::from_millis(500);

type Client = RunnerServiceClient<InterceptedService<Channel, Bearer>>;

/// Drives agents through the runner.
pub struct Driver<S> {
    store: S,
    tokens: Arc<Tokens>,
    runner: Client,
    tail_max: usize,
    /// How long after its creation a session's agent may still be started.
    start_deadline: Duration,
    /// Serialises stdin delivery per session, so messages keep their order.
    delivering: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Sessions whose events are being followed.
    following: Mutex<HashSet<String>>,
    /// When this driver started: sessions created since are launched by
    /// this process, and reconciliation leaves them alone.
    started_at_ms: i64,
    shutdown: CancellationToken,
}

impl<S: Store> Driver<S> {
    pub fn new(
        store: S,
        tokens: Arc<Tokens>,
        channel: Channel,
        operator_token: &str,
        tail_max: usize,
        start_deadline: Duration,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Arc<Self>> {
        let auth = Bearer::new(Some(operator_token))?;
        Ok(Arc::new(Driver {
            store,
            tokens,
            runner: RunnerServiceClient::with_interceptor(channel, auth)
                .max_decoding_message_size(16 << 20),
            tail_max,
            start_deadline,
            delivering: Mutex::new(HashMap::new()),
            following: Mutex::new(HashSet::new()),
            started_at_ms: crate::model::now_ms(),
            shutdown,
        }))
    }

    /// Whether the session is still pending or running (assumed so when the
    /// ledger cannot be read: the next check decides).
    async fn is_active(&self, session_id: &str) -> bool {
        !matches!(self.store.get_session(session_id).await, Ok(Some(row)) if !row.is_active())
    }
}

/// An audit record of the driver's own doing.
fn system_audit(
    action: &'static str,
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
