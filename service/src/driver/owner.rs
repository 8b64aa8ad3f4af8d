//! The owner's loop: one task per term of the lease ([`Driver::own`]). It
//! records the embedded runner, reconciles each runner (again whenever one
//! registers anew), and takes the work that any service recorded in the
//! store, woken by the store's commits
//! (LISTEN/NOTIFY across PostgreSQL replicas) and at least every
//! [`WORK_POLL`]. With no runner at all nothing can be driven: the store is
//! read only at that poll, for runners.

use std::{sync::Arc, time::Duration};

use super::{Driver, Job, Term};
use crate::{
    model::SessionId,
    store::{DriverWork, Store},
};

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
        self.set_embedded(&term).await;
        let mut wake = self.store.subscribe();
        while term.live() {
            // Marked seen before the read, so a commit during it wakes the next.
            wake.borrow_and_update();
            let runners = match self.refresh_runners().await {
                Ok(runners) => runners,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the runners");
                    Vec::new()
                }
            };
            // With no runner at all, nothing can be driven: sessions stay
            // pending, and the store is read only at the poll, for runners.
            let idle = runners.is_empty();
            if !idle {
                self.reconcile_runners(&term, &runners);
                match self.store.driver_work().await {
                    Ok(work) => self.take(&term, work),
                    Err(e) => tracing::warn!(error = %e, "cannot read the driver's work"),
                }
            }
            tokio::select! {
                changed = wake.changed(), if !idle => if changed.is_err() { break },
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
        if self.has_live_runner() {
            for session in work.unstarted {
                self.launch_in(term, session);
            }
        }
        // One task, deepest first: a child ends before its parent, so a
        // CALLBACK parent lost with it is told before it ends itself.
        let lost: Vec<SessionId> = work
            .runner_lost
            .into_iter()
            .filter(|id| self.claim(Job::Lose, id))
            .collect();
        if !lost.is_empty() {
            let driver = self.clone();
            let term = term.clone();
            tokio::spawn(async move {
                for id in lost {
                    tokio::select! {
                        () = driver.lose(&term, &id) => {}
                        () = term.cancelled() => {}
                    }
                    driver.release(Job::Lose, &id);
                }
            });
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
}
