//! A term of ownership of one shard's background work, as the driver holds
//! it: the shard lease's [`Fence`] that every write carries, and the token
//! that stops every task of the term at once; and [`Terms`], the terms a
//! service holds, by shard.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio_util::sync::CancellationToken;

use crate::{
    error::SessionError,
    shard::{Shard, ShardSet},
    store::Fence,
};

/// One term: cheap to clone, shared by every task it spawns.
#[derive(Clone, Debug)]
pub struct Term {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    fence: Fence,
    cancel: CancellationToken,
    /// When the lease was last renewed (the monotonic clock, which runs on
    /// while the process is stopped), and how long a renewal lasts.
    renewed_at: Mutex<Instant>,
    ttl: Duration,
}

impl Term {
    /// A term just acquired, ending with `parent` at the latest.
    pub fn new(fence: Fence, ttl: Duration, parent: &CancellationToken) -> Term {
        Term {
            inner: Arc::new(Inner {
                fence,
                cancel: parent.child_token(),
                renewed_at: Mutex::new(Instant::now()),
                ttl,
            }),
        }
    }

    pub fn fence(&self) -> &Fence {
        &self.inner.fence
    }

    /// The token every task of the term ends on.
    pub fn cancelled(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.inner.cancel.cancelled()
    }

    pub fn token(&self) -> CancellationToken {
        self.inner.cancel.clone()
    }

    /// Records a renewal made at `at` (taken before the renewal was sent).
    pub fn renewed(&self, at: Instant) {
        *self.inner.renewed_at.lock().expect("poisoned") = at;
    }

    /// Whether this term may still act: not ended, and renewed within its
    /// time. Checked before every call to the runner, so a process that was
    /// paused past its time does nothing once it wakes, before its first
    /// write is refused.
    pub fn live(&self) -> bool {
        !self.inner.cancel.is_cancelled()
            && self.inner.renewed_at.lock().expect("poisoned").elapsed() < self.inner.ttl
    }

    /// Ends the term: every task of it stops.
    pub fn end(&self) {
        self.inner.cancel.cancel();
    }

    /// Ends the term if `error` says the store refused its fence; returns
    /// the error for the caller to pass on.
    pub fn check<T>(&self, result: Result<T, SessionError>) -> Result<T, SessionError> {
        if let Err(e) = &result
            && e.is_fenced()
        {
            if !self.inner.cancel.is_cancelled() {
                tracing::warn!(
                    shard = %self.inner.fence.shard,
                    epoch = self.inner.fence.epoch,
                    "lease lost: stopping the shard's background work"
                );
            }
            self.end();
        }
        result
    }
}

/// The terms a service holds, one per shard at most: the owner's loop
/// (`crate::owner`) adds and removes them, the driver and the deadlines
/// read them. Every piece of work goes to its shard's term, or waits for
/// the shard's owner if this service is not it.
#[derive(Debug, Default)]
pub struct Terms {
    held: Mutex<BTreeMap<Shard, Term>>,
    /// Wakes whoever waits for a term to be added.
    added: tokio::sync::Notify,
}

impl Terms {
    /// Adds `term` (a new term of its shard replaces an older one).
    pub fn insert(&self, term: Term) {
        self.held
            .lock()
            .expect("poisoned")
            .insert(term.fence().shard, term);
        self.added.notify_waiters();
    }

    /// Removes `term`, if it is still its shard's.
    pub fn remove(&self, term: &Term) {
        let mut held = self.held.lock().expect("poisoned");
        let shard = term.fence().shard;
        if held.get(&shard).is_some_and(|t| t.fence() == term.fence()) {
            held.remove(&shard);
        }
    }

    /// The live term of `shard`, if held.
    pub fn of(&self, shard: Shard) -> Option<Term> {
        let held = self.held.lock().expect("poisoned");
        held.get(&shard).filter(|t| t.live()).cloned()
    }

    /// The live term of `workspace`'s shard, if held.
    pub fn of_workspace(&self, workspace: &str) -> Option<Term> {
        self.of(Shard::of(workspace))
    }

    /// Whether any term held is live.
    pub fn any_live(&self) -> bool {
        self.held.lock().expect("poisoned").values().any(Term::live)
    }

    /// Every term held, live or not, in shard order.
    pub fn all(&self) -> Vec<Term> {
        self.held
            .lock()
            .expect("poisoned")
            .values()
            .cloned()
            .collect()
    }

    /// The live terms, and their shards as a set.
    pub fn live(&self) -> (ShardSet, Vec<Term>) {
        let terms: Vec<Term> = self.all().into_iter().filter(Term::live).collect();
        (terms.iter().map(|t| t.fence().shard).collect(), terms)
    }

    /// Resolves once a term is added after this call.
    pub fn added(&self) -> tokio::sync::futures::Notified<'_> {
        self.added.notified()
    }
}
