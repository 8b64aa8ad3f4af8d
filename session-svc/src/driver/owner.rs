//! The owner's loop: one task per term of the lease ([`Driver::own`]). It
//! reconciles every active session with the runner, then takes the work
//! that any service recorded in the store, woken by the store's commits
//! (LISTEN/NOTIFY across PostgreSQL replicas) and at least every
//! [`WORK_POLL`].

use std::{sync::Arc, time::Duration};

use super::{Driver, Job, RETRY, Term};
use crate::store::{DriverWork, Store};

/// How often the store is read for work when nothing woke the owner.
const WORK_POLL: Duration = Duration::from_secs(1);
/// How long a burst of wake-ups is gathered into one read of the work.
const WORK_GATHER: Duration = Duration::from_millis(20);

impl<S: Store> Driver<S> {
    /// Runs the background work of `term` until it ends (lease lost or
    /// given up, or the service stops).
    pub async fn own(self: Arc<Self>, term: Term) {
        *self.term.lock().expect("poisoned") = Some(term.clone());
        tracing::info!(epoch = term.fence().epoch, "driving the background work");
        self.reconcile(&term).await;
        let mut wake = self.store.subscribe();
        while term.live() {
            // Marked seen before the read, so a commit during it wakes the next.
            wake.borrow_and_update();
            match self.store.driver_work().await {
                Ok(work) => self.take(&term, work),
                Err(e) => tracing::warn!(error = %e, "cannot read the driver's work"),
            }
            tokio::select! {
                changed = wake.changed() => if changed.is_err() { break },
                () = tokio::time::sleep(WORK_POLL) => {}
                () = term.cancelled() => break,
            }
            tokio::select! {
                () = tokio::time::sleep(WORK_GATHER) => {}
                () = term.cancelled() => break,
            }
        }
        let mut current = self.term.lock().expect("poisoned");
        if current.as_ref().is_some_and(|t| t.fence() == term.fence()) {
            *current = None;
        }
    }

    /// Hands each piece of work to its task (each at most once at a time).
    fn take(self: &Arc<Self>, term: &Term, work: DriverWork) {
        for session in work.unstarted {
            self.launch_in(term, session);
        }
        for id in work.undelivered {
            if !self.claim(Job::Deliver, &id) {
                continue;
            }
            let driver = self.clone();
            let term = term.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = driver.deliver_in(&term, &id) => {}
                    () = term.cancelled() => {}
                }
                driver.release(Job::Deliver, &id);
            });
        }
        if !work.unstopped.is_empty() {
            self.stop_in(term, work.unstopped);
        }
        for id in work.callbacks_due {
            let driver = self.clone();
            let term = term.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = driver.callback(&term, &id) => {}
                    () = term.cancelled() => {}
                }
            });
        }
    }

    /// Reconciles until the runner answers or the term ends.
    async fn reconcile(self: &Arc<Self>, term: &Term) {
        while term.live() {
            match self.reconcile_once(term).await {
                Ok(()) => return,
                Err(e) => tracing::info!(error = %e, "runner not reachable yet; retrying"),
            }
            tokio::select! {
                () = tokio::time::sleep(RETRY * 4) => {}
                () = term.cancelled() => return,
            }
        }
    }
}
