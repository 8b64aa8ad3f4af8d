//! The owner's loop: one task for the service's life ([`Driver::own`]).
//! While this service holds shards (its [`Terms`]) it records the
//! embedded runner (with the fleet's shard), reconciles each runner for
//! the terms not yet reconciled (again whenever one registers anew), and
//! takes the work that any service recorded in those shards, woken by the
//! commits that may have made work in them (`LogStore::subscribe_work`:
//! across PostgreSQL replicas by `troupe_work` notifications naming their
//! shards; output wakes no one), by a new term, and at least every
//! [`WORK_POLL`]. With no runner at all nothing
//! can be driven: the store is read only at that poll, for runners.

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use super::{Driver, Job, Term};
use crate::{
    model::SessionId,
    shard::Shard,
    store::{DriverWork, Store},
};

/// How often the store is read for work when nothing woke the owner.
const WORK_POLL: Duration = Duration::from_secs(1);
/// How long a burst of wake-ups is gathered into one read of the work.
const WORK_GATHER: Duration = Duration::from_millis(20);

impl<S: Store> Driver<S> {
    /// Runs the background work of the shards this service holds, as they
    /// come and go, until `cancel`.
    pub async fn own(self: Arc<Self>, cancel: CancellationToken) {
        let mut wake = self.store.subscribe_work();
        // The fleet's term the embedded runner was recorded in.
        let mut recorded: Option<i64> = None;
        while !cancel.is_cancelled() {
            let added = self.terms.added();
            tokio::pin!(added);
            let (shards, terms) = self.terms.live();
            if shards.is_empty() {
                tokio::select! {
                    () = &mut added => {}
                    () = tokio::time::sleep(WORK_POLL) => {}
                    () = cancel.cancelled() => break,
                }
                continue;
            }
            if let Some(fleet) = self.terms.of(Shard::FLEET)
                && recorded != Some(fleet.fence().epoch)
            {
                self.set_embedded(&fleet).await;
                recorded = Some(fleet.fence().epoch);
            }
            // Marked seen before the read, so a commit during it wakes the next.
            wake.borrow_and_update();
            self.store.take_work();
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
                self.reconcile_runners(&terms, &runners);
                match self.store.driver_work(shards).await {
                    Ok(work) => self.take(work),
                    Err(e) => tracing::warn!(error = %e, "cannot read the driver's work"),
                }
            }
            // Until work in these shards, a new term, or the poll.
            let poll = tokio::time::sleep(WORK_POLL);
            tokio::pin!(poll);
            loop {
                tokio::select! {
                    changed = wake.changed(), if !idle => if changed.is_err() { return },
                    () = &mut added => break,
                    () = &mut poll => break,
                    () = cancel.cancelled() => return,
                }
                tokio::select! {
                    () = tokio::time::sleep(WORK_GATHER) => {}
                    () = cancel.cancelled() => return,
                }
                let marked = self.store.take_work();
                if shards.iter().any(|s| marked.contains(s)) {
                    break;
                }
            }
        }
    }

    /// Hands each piece of work to its task in its shard's term (each at
    /// most once at a time); work of a shard no longer held is left to its
    /// next owner.
    fn take(self: &Arc<Self>, work: DriverWork) {
        if self.has_live_runner() {
            for session in work.unstarted {
                if let Some(term) = self.terms.of_workspace(&session.workspace_id) {
                    self.launch_in(&term, session);
                }
            }
        }
        // One task, deepest first: a child ends before its parent, so a
        // CALLBACK parent lost with it is told before it ends itself.
        let lost: Vec<(Term, SessionId)> = self
            .in_terms(work.runner_lost)
            .into_iter()
            .filter(|(_, id)| self.claim(Job::Lose, id))
            .collect();
        if !lost.is_empty() {
            let driver = self.clone();
            tokio::spawn(async move {
                for (term, id) in lost {
                    tokio::select! {
                        () = driver.lose(&term, &id) => {}
                        () = term.cancelled() => {}
                    }
                    driver.release(Job::Lose, &id);
                }
            });
        }
        for (term, id) in self.in_terms(work.undelivered) {
            if !self.claim(Job::Deliver, &id) {
                continue;
            }
            let driver = self.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = driver.deliver_in(&term, &id) => {}
                    () = term.cancelled() => {}
                }
                driver.release(Job::Deliver, &id);
            });
        }
        // One task per shard, each stopping its processes in turn.
        let mut unstopped: std::collections::BTreeMap<Shard, (Term, Vec<SessionId>)> =
            std::collections::BTreeMap::new();
        for (term, id) in self.in_terms(work.unstopped) {
            let shard = term.fence().shard;
            unstopped
                .entry(shard)
                .or_insert((term, Vec::new()))
                .1
                .push(id);
        }
        for (term, ids) in unstopped.into_values() {
            self.stop_in(&term, ids);
        }
        for (term, id) in self.in_terms(work.callbacks_due) {
            let driver = self.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = driver.callback(&term, &id) => {}
                    () = term.cancelled() => {}
                }
            });
        }
    }

    /// Each session with its shard's live term, those of a shard not held
    /// left out.
    fn in_terms(&self, work: Vec<(Shard, SessionId)>) -> Vec<(Term, SessionId)> {
        work.into_iter()
            .filter_map(|(shard, id)| Some((self.terms.of(shard)?, id)))
            .collect()
    }
}
