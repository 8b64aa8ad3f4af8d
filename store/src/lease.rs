//! The lease of the background work: the driver, life-span export and
//! pruning run in one service at a time, the lease's holder, for a term
//! whose epoch is the fencing token. Every write the background work makes
//! carries its [`Fence`], and the store checks it inside the write's own
//! transaction against the lease row (holder, epoch, and expiry on the
//! database's clock): a service that lost the lease, however long it was
//! paused, writes nothing more ([`crate::error::SessionError::Fenced`]).

use std::{future::Future, time::Duration};

use crate::{error::SessionError, model::Action};

/// The name of the one lease (the table may hold others later).
pub const BACKGROUND: &str = "background";

/// Who holds, or asks for, the lease: one service process, named at its
/// start (so a restarted service is a new holder).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Holder(String);

impl Holder {
    /// A new holder's name, unique to this process.
    pub fn generate() -> Holder {
        Holder(format!("svc_{}", uuid::Uuid::now_v7().simple()))
    }

    /// A holder of a known name (as stored).
    pub fn named(name: impl Into<String>) -> Holder {
        Holder(name.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One term of the lease: its holder, its epoch, bumped by every
/// acquisition, and how long it lasts unless renewed. Every background
/// write carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub holder: Holder,
    pub epoch: i64,
    /// The lease's time to live its holder asked for: a write of the term
    /// holds the lease row no longer than this while it stalls (PostgreSQL).
    pub ttl: Duration,
}

impl Fence {
    /// The term `epoch` of `holder`'s lease, asked for `ttl`, if a try took
    /// it.
    pub(crate) fn taken(holder: &Holder, epoch: Option<i64>, ttl: Duration) -> Option<Fence> {
        epoch.map(|epoch| Fence {
            holder: holder.clone(),
            epoch,
            ttl,
        })
    }

    /// Whether a write of this term may go on, given whether the lease row
    /// still holds it (`live`): else it is refused as fenced.
    pub(crate) fn held(&self, live: bool) -> Result<(), crate::error::SessionError> {
        if live {
            Ok(())
        } else {
            Err(crate::error::SessionError::Fenced { epoch: self.epoch })
        }
    }
}

/// The lease row as the database has it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub holder: Holder,
    pub epoch: i64,
    /// Whether it is still unexpired, on the database's clock.
    pub live: bool,
}

/// The lease's timing: how long a term lasts unless renewed, and how often
/// its holder renews it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTiming {
    pub ttl: Duration,
    pub renew_every: Duration,
}

/// The actions whose request-id records are pruned past their retention:
/// the calls that carry a caller's request id. The callback guard is one
/// row per child session (whose rows are kept too), not per call.
pub(crate) const PRUNED_ACTIONS: [&str; 6] = [
    Action::CreateRootSession.as_str(),
    Action::CreateSession.as_str(),
    Action::SendMessage.as_str(),
    Action::ReplyToParent.as_str(),
    Action::Broadcast.as_str(),
    Action::PostToGroup.as_str(),
];

/// How many request-id records one pruning transaction deletes at most.
pub const REQUEST_ID_PRUNE_BATCH: u32 = 1000;

/// The request-id guard of a child's callback notice: one per child.
pub(crate) fn callback_guard(child_id: &str) -> crate::model::Idempotency {
    crate::model::Idempotency {
        caller: crate::model::Principal::Troupe,
        action: Action::Callback,
        request_id: child_id.to_owned(),
        payload_hash: child_id.to_owned(),
        // One notice per child, ever: this guard never expires, and is not
        // pruned (see `PRUNED_ACTIONS`).
        window_start_ms: i64::MIN,
    }
}

/// Milliseconds of a duration, for SQL.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The lease of the background work; every [`super::Store`] is one.
pub trait LeaseStore: Send + Sync {
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
}
