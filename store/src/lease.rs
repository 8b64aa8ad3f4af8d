//! The leases of the background work, one per shard
//! ([`crate::shard::Shard`]): a shard's agents are driven, its callbacks
//! sent and its budgets' deadlines kept by one service at a time, the
//! holder of its lease, for a term whose epoch is the fencing token. Every
//! write the background work makes carries its [`Fence`], and the store
//! checks it inside the write's own transaction against the shard's lease
//! row (holder, epoch, and expiry on the database's clock): a service that
//! lost the shard, however long it was paused, writes nothing more for it
//! ([`crate::error::SessionError::Fenced`]). The fleet's own upkeep
//! (pruning, export, the embedded runner's record) is fenced by the lease
//! of [`Shard::FLEET`].
//!
//! Each service also renews a row of its own among the replicas
//! ([`LeaseStore::heartbeat`]): the live replicas divide the shards
//! ([`share_of`]).

use std::{future::Future, time::Duration};

use crate::{error::SessionError, model::Action, shard::Shard};

/// Who holds, or asks for, the lease: one service process, named at its
/// start (so a restarted service is a new holder).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Holder(String);

impl Holder {
    /// A new holder's name, unique to this process: `svc_<pid>_<uuid>`,
    /// so an operator can tell which process holds what.
    pub fn generate() -> Holder {
        Holder(format!(
            "svc_{}_{}",
            std::process::id(),
            uuid::Uuid::now_v7().simple()
        ))
    }

    /// The process id its name was generated with, if it was.
    pub fn pid(&self) -> Option<u32> {
        self.0.strip_prefix("svc_")?.split('_').next()?.parse().ok()
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

/// One term of a shard's lease: its holder, its epoch, bumped by every
/// acquisition, and how long it lasts unless renewed. Every background
/// write of the shard carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub holder: Holder,
    pub shard: Shard,
    pub epoch: i64,
    /// The lease's time to live its holder asked for: a write of the term
    /// holds the lease row no longer than this while it stalls (PostgreSQL).
    pub ttl: Duration,
}

impl Fence {
    /// The terms a try for leases took, as the rows it updated name them
    /// (lease name, new epoch).
    pub(crate) fn taken(holder: &Holder, rows: Vec<(String, i64)>, ttl: Duration) -> Vec<Fence> {
        let mut fences: Vec<Fence> = rows
            .into_iter()
            .filter_map(|(name, epoch)| {
                Some(Fence {
                    holder: holder.clone(),
                    shard: Shard::from_lease_name(&name)?,
                    epoch,
                    ttl,
                })
            })
            .collect();
        fences.sort_by_key(|f| f.shard);
        fences
    }

    /// The key a statement matches its lease row by: name and epoch, as
    /// `name || '#' || epoch` reads them.
    pub(crate) fn key(&self) -> String {
        format!("{}#{}", self.shard.lease_name(), self.epoch)
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

/// A shard's lease row as the database has it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub shard: Shard,
    pub holder: Holder,
    pub epoch: i64,
    /// Whether it is still unexpired, on the database's clock.
    pub live: bool,
}

/// A replica (a service on the database) as its row says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    pub holder: Holder,
    /// Whether its row is unexpired, on the database's clock.
    pub live: bool,
}

/// The leases' timing: how long a term lasts unless renewed, and how often
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

/// The shards' leases and the replicas' rows; every [`super::Store`] is
/// one.
pub trait LeaseStore: Send + Sync {
    /// Takes up to `want` shards that are free or expired (on the
    /// database's clock) for `holder`, lowest first, bumping each one's
    /// epoch; returns the new terms. On PostgreSQL a shard a write of its
    /// last term still holds is skipped, never waited for.
    fn acquire_shards(
        &self,
        holder: &Holder,
        want: usize,
        ttl: Duration,
    ) -> impl Future<Output = Result<Vec<Fence>, SessionError>> + Send;

    /// Takes `shard` for `holder` if it is free or expired; `None` while
    /// another term of it is live.
    fn acquire_shard(
        &self,
        holder: &Holder,
        shard: Shard,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Fence>, SessionError>> + Send;

    /// Extends by `ttl` from now each of `fences` (one holder's) still
    /// live; returns the shards extended. The others' terms are over
    /// (expired or taken over), which their holder cannot undo. Never
    /// waits behind a write of those terms.
    fn renew_shards(
        &self,
        fences: &[Fence],
        ttl: Duration,
    ) -> impl Future<Output = Result<Vec<Shard>, SessionError>> + Send;

    /// Ends the terms of `fences` (one holder's) now, so others take the
    /// shards without waiting out their time.
    fn release_shards(
        &self,
        fences: &[Fence],
    ) -> impl Future<Output = Result<(), SessionError>> + Send;

    /// Every shard's lease as it stands, in shard order.
    fn shard_leases(&self) -> impl Future<Output = Result<Vec<Lease>, SessionError>> + Send;

    /// Records `holder` alive for `ttl` from now (and forgets replicas
    /// dead for a minute); returns the live ones, itself included, in
    /// holder order.
    fn heartbeat(
        &self,
        holder: &Holder,
        ttl: Duration,
    ) -> impl Future<Output = Result<Vec<Holder>, SessionError>> + Send;

    /// Removes `holder`'s row (a service that stops).
    fn leave(&self, holder: &Holder) -> impl Future<Output = Result<(), SessionError>> + Send;

    /// The replicas' rows, live or not.
    fn replicas(&self) -> impl Future<Output = Result<Vec<Replica>, SessionError>> + Send;

    /// Takes the lease of [`Shard::FLEET`] (see [`LeaseStore::acquire_shard`]).
    fn acquire_lease(
        &self,
        holder: &Holder,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Fence>, SessionError>> + Send {
        self.acquire_shard(holder, Shard::FLEET, ttl)
    }

    /// Extends `fence`'s term; false if it is over.
    fn renew_lease(
        &self,
        fence: &Fence,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, SessionError>> + Send {
        async move {
            let renewed = self.renew_shards(std::slice::from_ref(fence), ttl).await?;
            Ok(renewed.contains(&fence.shard))
        }
    }

    /// Ends `fence`'s term now.
    fn release_lease(
        &self,
        fence: &Fence,
    ) -> impl Future<Output = Result<(), SessionError>> + Send {
        self.release_shards(std::slice::from_ref(fence))
    }

    /// The lease of [`Shard::FLEET`] as it stands.
    fn lease(&self) -> impl Future<Output = Result<Option<Lease>, SessionError>> + Send {
        async move {
            let leases = self.shard_leases().await?;
            Ok(leases
                .into_iter()
                .find(|l| l.shard == Shard::FLEET && l.epoch > 0))
        }
    }
}

/// `me`'s share of the shards among the `live` replicas (in holder order,
/// itself among them): the shards divided by their number, one more for
/// each of the first (the remainder), so the shares add up to every shard
/// (past as many replicas as shards, the last hold none).
pub fn share_of(live: &[Holder], me: &Holder) -> usize {
    let shards = usize::from(crate::shard::SHARDS);
    let n = live.len().max(1);
    let rank = live.iter().position(|h| h == me).unwrap_or(n - 1);
    shards / n + usize::from(rank < shards % n)
}

/// Leases as rows read them (name, holder, epoch, live): the shards' only,
/// never held ones (epoch 0) with no holder.
pub(crate) fn leases_of(rows: Vec<(String, String, i64, bool)>) -> Vec<Lease> {
    rows.into_iter()
        .filter_map(|(name, holder, epoch, live)| {
            Some(Lease {
                shard: Shard::from_lease_name(&name)?,
                holder: Holder::named(holder),
                epoch,
                live: live && epoch > 0,
            })
        })
        .collect()
}

/// The live replicas: `others` as read, and `me`, in holder order.
pub(crate) fn live_with(others: Vec<String>, me: &Holder) -> Vec<Holder> {
    let mut live: Vec<Holder> = others.into_iter().map(Holder::named).collect();
    live.push(me.clone());
    live.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    live.dedup();
    live
}

/// Replicas as rows read them (holder, live).
pub(crate) fn replicas_of(rows: Vec<(String, bool)>) -> Vec<Replica> {
    rows.into_iter()
        .map(|(holder, live)| Replica {
            holder: Holder::named(holder),
            live,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shares_add_up_to_every_shard_and_differ_by_one_at_most() {
        for n in 1..=70 {
            let live: Vec<Holder> = (0..n).map(|i| Holder::named(format!("r{i:03}"))).collect();
            let shares: Vec<usize> = live.iter().map(|h| share_of(&live, h)).collect();
            let sum: usize = shares.iter().sum();
            assert_eq!(sum, usize::from(crate::shard::SHARDS), "{n} replicas");
            let (min, max) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
            assert!(max - min <= 1, "{n} replicas: {shares:?}");
        }
        let alone = [Holder::named("a")];
        assert_eq!(share_of(&alone, &alone[0]), 64);
    }
}
