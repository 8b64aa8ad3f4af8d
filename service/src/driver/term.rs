//! A term of ownership of the background work, as the driver holds it: the
//! lease's [`Fence`] that every write carries, and the token that stops
//! every task of the term at once.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio_util::sync::CancellationToken;

use crate::{error::SessionError, store::Fence};

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
                    epoch = self.inner.fence.epoch,
                    "lease lost: stopping the background work"
                );
            }
            self.end();
        }
        result
    }
}
