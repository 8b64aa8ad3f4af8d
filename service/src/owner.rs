//! Who runs the background work: the driver (launching, following,
//! delivering, stopping, callbacks, reconciling), life-span export, event
//! pruning and the wall-clock budgets (ending the subtrees whose deadline
//! passed) run in one service at a time, the holder of the lease
//! (`LeaseStore::acquire_lease`). Every service (a SQLite one is alone on its
//! database) tries for the lease, renews it while it holds it, and runs the work only for the term it holds: a
//! [`Term`] whose fence every background write carries. A term ends when a
//! renewal fails or is late (past the lease's time on this process's
//! monotonic clock), when a write is refused as fenced, or when the service
//! stops (then the lease is released, so another takes over at once).
//!
//! The first try is made before the service serves ([`first_try`]): if it
//! wins, old events are pruned at once. The wall-clock budgets are read
//! every [`DEADLINES_EVERY`]: each subtree whose deadline passed ends (end
//! reason `budget`, fenced and audited).

use std::{sync::Arc, time::Instant};

use tokio_util::sync::CancellationToken;

use crate::{
    driver::{Driver, Term},
    error::Reason,
    lives,
    model::{AuditRecord, Principal, now_ms},
    store::{Fence, Holder, LeaseTiming, REQUEST_ID_PRUNE_BATCH, Store},
};

/// How often old events are pruned.
const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
/// How often the wall-clock budgets are checked: a subtree ends at most this
/// long after its deadline.
pub const DEADLINES_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// What the owner of the background work runs.
pub struct Work<S: Store> {
    pub store: S,
    pub driver: Option<Arc<Driver<S>>>,
    pub timing: LeaseTiming,
    /// Events kept for watchers (`--event-retention`).
    pub keep: u64,
    /// How long request ids are remembered (`--request-id-retention-secs`).
    pub request_ids: std::time::Duration,
    /// Whether life spans are exported, and from which event the first
    /// term exports ends (where the feed was when the service started).
    pub lives_from: Option<i64>,
}

/// The first try for the lease, made before the service serves: if it is
/// won, old events are pruned at once, so a restarted service serves with
/// its retention applied (a cursor older than what is kept is refused from
/// the first call). Returns the term's fence and when it was asked for.
pub async fn first_try<S: Store>(work: &Work<S>, holder: &Holder) -> Option<(Fence, Instant)> {
    let asked_at = Instant::now();
    match work.store.acquire_lease(holder, work.timing.ttl).await {
        Ok(Some(fence)) => {
            if let Err(e) = work.store.prune_events(&fence, work.keep).await {
                tracing::warn!(error = %e, "event pruning failed");
            }
            Some((fence, asked_at))
        }
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(error = %e, "cannot try for the lease");
            None
        }
    }
}

/// Runs the work for the term `first` won (see [`first_try`]), if any, then
/// tries for the lease until `cancel`, and runs the work for every term it
/// holds.
pub async fn run<S: Store>(
    work: Work<S>,
    holder: Holder,
    mut first: Option<(Fence, Instant)>,
    cancel: CancellationToken,
) {
    let mut lives_from = work.lives_from;
    loop {
        let won = match first.take() {
            Some((fence, asked_at)) => Ok((Some(fence), asked_at)),
            None => {
                let asked_at = Instant::now();
                (work.store.acquire_lease(&holder, work.timing.ttl).await).map(|f| (f, asked_at))
            }
        };
        match won {
            Ok((Some(fence), asked_at)) => {
                let term = Term::new(fence, work.timing.ttl, &cancel);
                term.renewed(asked_at);
                let from = match lives_from.take() {
                    Some(from) => Some(from),
                    None if work.lives_from.is_some() => work.store.newest_event().await.ok(),
                    None => None,
                };
                hold(&work, &term, from).await;
                if cancel.is_cancelled() {
                    if let Err(e) = work.store.release_lease(term.fence()).await {
                        tracing::warn!(error = %e, "cannot release the lease");
                    }
                    return;
                }
            }
            Ok((None, _)) => {}
            Err(e) => tracing::warn!(error = %e, "cannot try for the lease"),
        }
        tokio::select! {
            () = tokio::time::sleep(work.timing.renew_every) => {}
            () = cancel.cancelled() => return,
        }
    }
}

/// Runs one term: the driver, export and pruning, and the renewals, until
/// the term ends.
async fn hold<S: Store>(work: &Work<S>, term: &Term, lives_from: Option<i64>) {
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(driver) = &work.driver {
        tasks.spawn(driver.clone().own(term.clone()));
    }
    if let Some(from) = lives_from
        && troupe_telemetry::exporting()
    {
        tasks.spawn(lives::export(work.store.clone(), from, term.token()));
    }
    tasks.spawn(prune(
        work.store.clone(),
        term.clone(),
        work.keep,
        work.request_ids,
    ));
    tasks.spawn(deadlines(
        work.store.clone(),
        work.driver.clone(),
        term.clone(),
    ));
    let mut renew = tokio::time::interval(work.timing.renew_every);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while term.live() {
        tokio::select! {
            _ = renew.tick() => {}
            () = term.cancelled() => break,
        }
        let asked_at = Instant::now();
        match work.store.renew_lease(term.fence(), work.timing.ttl).await {
            Ok(true) => term.renewed(asked_at),
            Ok(false) => {
                tracing::warn!(
                    epoch = term.fence().epoch,
                    "lease lost: stopping the background work"
                );
                term.end();
            }
            // Unknown: the term lasts until its time is out (`live`).
            Err(e) => tracing::warn!(error = %e, "cannot renew the lease"),
        }
    }
    if !term.token().is_cancelled() {
        // Out of time on this clock: no renewal came back within the
        // lease's time (the process stalled, say), so another may hold it.
        tracing::warn!(
            epoch = term.fence().epoch,
            reason = "renewal late",
            "lease lost: stopping the background work"
        );
    }
    term.end();
    while tasks.join_next().await.is_some() {}
}

/// Prunes old events and expired request ids at the start of the term,
/// then every [`PRUNE_EVERY`].
async fn prune<S: Store>(store: S, term: Term, keep: u64, request_ids: std::time::Duration) {
    let mut every = tokio::time::interval(PRUNE_EVERY);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = term.cancelled() => return,
        }
        if let Err(e) = term.check(store.prune_events(term.fence(), keep).await) {
            tracing::warn!(error = %e, "event pruning failed");
        }
        prune_request_ids(&store, &term, request_ids).await;
    }
}

/// Ends, every [`DEADLINES_EVERY`], each active session whose wall-clock
/// budget ran out, with its subtree (end reason `budget`, audited, fenced),
/// and has the driver stop their agents.
async fn deadlines<S: Store>(store: S, driver: Option<Arc<Driver<S>>>, term: Term) {
    let mut every = tokio::time::interval(DEADLINES_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while term.live() {
        tokio::select! {
            _ = every.tick() => {}
            () = term.cancelled() => return,
        }
        let due = match store.over_deadline(now_ms()).await {
            Ok(due) => due,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the wall-clock budgets");
                continue;
            }
        };
        for session_id in due {
            let audit = AuditRecord {
                caller: Principal::Troupe,
                action: crate::model::Action::EndForBudget,
                target: session_id.to_string(),
                allowed: true,
                reason: Reason::BudgetExceeded.as_str().to_owned(),
                detail: String::new(),
            };
            match term.check(store.end_for_budget(term.fence(), &session_id, audit).await) {
                Ok(ended) if ended.is_empty() => {}
                Ok(ended) => {
                    tracing::info!(
                        %session_id,
                        ended = ended.len(),
                        "wall-clock budget ran out: subtree ended"
                    );
                    if let Some(driver) = &driver {
                        driver.stop(ended);
                    }
                }
                Err(e) => {
                    tracing::warn!(%session_id, error = %e, "cannot end a subtree past its deadline");
                    break;
                }
            }
        }
    }
}

/// Deletes the request ids older than `retention`, a batch per transaction
/// (so no write waits long behind one), until none is left or the term
/// ends.
async fn prune_request_ids<S: Store>(store: &S, term: &Term, retention: std::time::Duration) {
    let before = now_ms().saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX));
    while term.live() {
        match term.check(
            store
                .prune_request_ids(term.fence(), before, REQUEST_ID_PRUNE_BATCH)
                .await,
        ) {
            Ok(n) if n < u64::from(REQUEST_ID_PRUNE_BATCH) => return,
            Ok(_) => tokio::task::yield_now().await,
            Err(e) => {
                tracing::warn!(error = %e, "request id pruning failed");
                return;
            }
        }
    }
}
