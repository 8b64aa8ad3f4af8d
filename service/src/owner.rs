//! Who runs the background work, shard by shard (`crate::shard`): a
//! shard's agents are driven (launched, followed, delivered to, stopped,
//! their callbacks sent, their runners reconciled) and its wall-clock
//! budgets kept by one service at a time, the holder of the shard's lease
//! (`LeaseStore::acquire_shards`), for a [`Term`] whose fence every write
//! carries, and prunes the shard's old events. The holder of
//! [`Shard::FLEET`] also runs the fleet's upkeep: request-id pruning,
//! life-span export, the embedded runner's record, the shards of old
//! sessions.
//!
//! Every service runs [`run`]: every renewal period it renews the terms it
//! holds (one statement), says it is alive (`LeaseStore::heartbeat`, which
//! lists the live replicas), and moves towards its share, the shards
//! divided by the live replicas (one more for the first of them in holder
//! order, `store::share_of`, so the shares add up): it gives up what it holds
//! beyond its share (a replica joined) and takes free or expired shards up
//! to it (one left or died). A term ends when a renewal fails or is late
//! (past the lease's time on this process's monotonic clock), when a write
//! is refused as fenced, when it is given up, or when the service stops;
//! its shard is then released at once, so another takes it without waiting
//! out its time. A SQLite service is alone: its share is every shard.
//!
//! The first try is made before the service serves ([`first_try`]): the
//! shards it wins have their old events pruned at once. The wall-clock
//! budgets are read every [`DEADLINES_EVERY`], for the shards held: each
//! subtree whose deadline passed ends (end reason `budget`, fenced and
//! audited).

use std::{collections::BTreeMap, sync::Arc, time::Instant};

use tokio_util::sync::CancellationToken;

use crate::{
    driver::{Driver, Term, Terms},
    error::Reason,
    lives,
    model::{AuditRecord, Principal, now_ms},
    shard::{Shard, ShardSet},
    store::{Fence, Holder, LeaseTiming, REQUEST_ID_PRUNE_BATCH, Store, share_of},
};

/// How often old events are pruned.
const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
/// How long the start waits for its first pruning.
const FIRST_PRUNE_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);
/// How often the wall-clock budgets are checked: a subtree ends at most this
/// long after its deadline.
pub const DEADLINES_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// What the owner of shards runs.
pub struct Work<S: Store> {
    pub store: S,
    pub driver: Arc<Driver<S>>,
    pub timing: LeaseTiming,
    /// Events kept for watchers (`--event-retention`).
    pub keep: u64,
    /// How long request ids are remembered (`--request-id-retention-secs`).
    pub request_ids: std::time::Duration,
    /// Whether life spans are exported, and from which event the first
    /// term of the fleet's shard exports ends (where the feed was when the
    /// service started).
    pub lives_from: Option<crate::cursor::Cursor>,
}

/// The shards a first try took, and when it asked.
pub struct FirstTry {
    fences: Vec<Fence>,
    asked_at: Instant,
}

/// The first try for shards, made before the service serves: the shards it
/// wins have their old events pruned at once, so a restarted service
/// serves with its retention applied (a cursor older than what is kept is
/// refused from the first call), unless that takes longer than
/// [`FIRST_PRUNE_WITHIN`] (a shard's events held by a long transaction):
/// the start never waits on it longer.
pub async fn first_try<S: Store>(work: &Work<S>, holder: &Holder) -> FirstTry {
    let asked_at = Instant::now();
    if let Err(e) = work.store.shard_sessions().await {
        tracing::warn!(error = %e, "cannot record the shards of older sessions");
    }
    let fences = match share(work, holder).await {
        Some(share) => match work
            .store
            .acquire_shards(holder, share, work.timing.ttl)
            .await
        {
            Ok(fences) => fences,
            Err(e) => {
                tracing::warn!(error = %e, "cannot try for the shards");
                Vec::new()
            }
        },
        None => Vec::new(),
    };
    let pruning = async {
        for fence in &fences {
            if let Err(e) = work.store.prune_events(fence, work.keep).await {
                tracing::warn!(error = %e, shard = %fence.shard, "event pruning failed");
            }
        }
    };
    // A pruning that waits on a long transaction must not hold the start:
    // the pruning loop goes on with it at once.
    if tokio::time::timeout(FIRST_PRUNE_WITHIN, pruning)
        .await
        .is_err()
    {
        tracing::warn!("the first pruning did not end in time; it goes on in the background");
    }
    FirstTry { fences, asked_at }
}

/// This service's share of the shards among the live replicas (itself
/// recorded alive first, `store::share_of`); `None` if they cannot be read.
async fn share<S: Store>(work: &Work<S>, holder: &Holder) -> Option<usize> {
    match work.store.heartbeat(holder, work.timing.ttl).await {
        Ok(live) => Some(share_of(&live, holder)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot record this replica alive");
            None
        }
    }
}

/// The terms this service holds, each with what runs for it alone.
struct Held<S: Store> {
    work: Work<S>,
    holder: Holder,
    terms: Arc<Terms>,
    /// By shard: the term, and the fleet's upkeep tasks for the fleet's one.
    held: BTreeMap<Shard, Term>,
    cancel: CancellationToken,
    /// From which event the next fleet term exports life spans.
    lives_from: Option<crate::cursor::Cursor>,
    /// Every task started here (the driver's loop, the deadlines, the
    /// fleet's upkeep): awaited at the end, so none outlives the service.
    tasks: tokio::task::JoinSet<()>,
}

/// Runs the work for the shards `first` took, then every renewal period
/// renews, balances and takes shards (see the module's header) until
/// `cancel`; then ends every term, releases the shards and leaves.
pub async fn run<S: Store>(
    work: Work<S>,
    holder: Holder,
    first: FirstTry,
    cancel: CancellationToken,
) {
    let terms = work.driver.terms().clone();
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(work.driver.clone().own(cancel.clone()));
    tasks.spawn(deadlines(
        work.store.clone(),
        work.driver.clone(),
        cancel.clone(),
    ));
    tasks.spawn(prune_events(
        work.store.clone(),
        terms.clone(),
        work.keep,
        cancel.clone(),
    ));
    let lives_from = work.lives_from.clone();
    let mut me = Held {
        work,
        holder,
        terms,
        held: BTreeMap::new(),
        cancel,
        lives_from,
        tasks,
    };
    for fence in first.fences {
        me.start(fence, first.asked_at);
    }
    let mut every = tokio::time::interval(me.work.timing.renew_every);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = me.cancel.cancelled() => break,
        }
        // The fleet's upkeep of terms that ended: reaped as they go.
        while me.tasks.try_join_next().is_some() {}
        me.forget_ended().await;
        me.renew().await;
        if let Some(share) = share(&me.work, &me.holder).await {
            me.balance(share).await;
        }
    }
    let all: Vec<Term> = me.held.values().cloned().collect();
    me.give_up(all).await;
    if let Err(e) = me.work.store.leave(&me.holder).await {
        tracing::warn!(error = %e, "cannot remove this replica's row");
    }
    while me.tasks.join_next().await.is_some() {}
}

impl<S: Store> Held<S> {
    /// Starts the work of a new term, asked for at `asked_at`.
    fn start(&mut self, fence: Fence, asked_at: Instant) {
        let term = Term::new(fence, self.work.timing.ttl, &self.cancel);
        term.renewed(asked_at);
        let shard = term.fence().shard;
        tracing::debug!(%shard, epoch = term.fence().epoch, "shard taken");
        if shard == Shard::FLEET {
            self.fleet_upkeep(&term);
        }
        self.terms.insert(term.clone());
        self.held.insert(shard, term);
    }

    /// Starts the fleet's upkeep in the fleet shard's `term`.
    fn fleet_upkeep(&mut self, term: &Term) {
        let store = &self.work.store;
        self.tasks
            .spawn(upkeep(store.clone(), term.clone(), self.work.request_ids));
        if self.work.lives_from.is_some() && troupe_telemetry::exporting() {
            let store = store.clone();
            let from = self.lives_from.take();
            let term = term.clone();
            self.tasks.spawn(async move {
                let from = match from {
                    Some(from) => Some(from),
                    None => store
                        .event_heads()
                        .await
                        .ok()
                        .map(|heads| heads.live(ShardSet::ALL)),
                };
                if let Some(from) = from {
                    lives::export(store, from, term.token()).await;
                }
            });
        }
    }

    /// Releases and forgets the terms that ended on their own (fenced, or
    /// renewed too late on this clock).
    async fn forget_ended(&mut self) {
        let ended: Vec<Term> = self.held.values().filter(|t| !t.live()).cloned().collect();
        for term in &ended {
            tracing::warn!(
                shard = %term.fence().shard,
                epoch = term.fence().epoch,
                "shard lost: its background work stops here"
            );
        }
        self.give_up(ended).await;
    }

    /// Renews every term held, in one statement; a term not renewed is over.
    async fn renew(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let fences: Vec<Fence> = self.held.values().map(|t| t.fence().clone()).collect();
        let asked_at = Instant::now();
        match self
            .work
            .store
            .renew_shards(&fences, self.work.timing.ttl)
            .await
        {
            Ok(renewed) => {
                for term in self.held.values() {
                    if renewed.contains(&term.fence().shard) {
                        term.renewed(asked_at);
                    } else {
                        term.end();
                    }
                }
            }
            // Unknown: each term lasts until its time is out (`live`).
            Err(e) => tracing::warn!(error = %e, "cannot renew the shards' leases"),
        }
    }

    /// Gives up what is held beyond `share` (the highest shards), or takes
    /// free shards up to it.
    async fn balance(&mut self, share: usize) {
        let held = self.held.len();
        if held > share {
            let excess: Vec<Term> = self
                .held
                .values()
                .rev()
                .take(held - share)
                .cloned()
                .collect();
            tracing::info!(
                shards = excess.len(),
                share,
                "giving shards up to a replica that joined"
            );
            self.give_up(excess).await;
        } else if held < share {
            let asked_at = Instant::now();
            match self
                .work
                .store
                .acquire_shards(&self.holder, share - held, self.work.timing.ttl)
                .await
            {
                Ok(fences) => {
                    if !fences.is_empty() {
                        tracing::info!(shards = fences.len(), share, "shards taken");
                    }
                    for fence in fences {
                        self.start(fence, asked_at);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot try for the shards"),
            }
        }
    }

    /// Ends `terms` (their tasks stop at once, their writes in flight
    /// finish or are refused), forgets them and releases their leases, so
    /// others take them at once.
    async fn give_up(&mut self, terms: Vec<Term>) {
        if terms.is_empty() {
            return;
        }
        for term in &terms {
            term.end();
            self.terms.remove(term);
            self.held.remove(&term.fence().shard);
        }
        let fences: Vec<Fence> = terms.iter().map(|t| t.fence().clone()).collect();
        if let Err(e) = self.work.store.release_shards(&fences).await {
            tracing::warn!(error = %e, "cannot release the shards' leases");
        }
    }
}

/// Prunes the old events of each shard held, one shard after another (one
/// transaction at a time, so pruning never takes more than one of the
/// pool's connections), every [`PRUNE_EVERY`] until `cancel`.
async fn prune_events<S: Store>(store: S, terms: Arc<Terms>, keep: u64, cancel: CancellationToken) {
    let mut every = tokio::time::interval(PRUNE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = cancel.cancelled() => return,
        }
        let (_, held) = terms.live();
        for term in held {
            let pruned = tokio::select! {
                pruned = store.prune_events(term.fence(), keep) => pruned,
                () = term.cancelled() => continue,
            };
            if let Err(e) = term.check(pruned) {
                tracing::warn!(error = %e, shard = %term.fence().shard, "event pruning failed");
            }
        }
    }
}

/// Prunes expired request ids and records the shards of sessions written
/// without one, at the start of the fleet's term, then every
/// [`PRUNE_EVERY`].
async fn upkeep<S: Store>(store: S, term: Term, request_ids: std::time::Duration) {
    let mut every = tokio::time::interval(PRUNE_EVERY);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = term.cancelled() => return,
        }
        prune_request_ids(&store, &term, request_ids).await;
        if let Err(e) = store.shard_sessions().await {
            tracing::warn!(error = %e, "cannot record the shards of older sessions");
        }
    }
}

/// Ends, every [`DEADLINES_EVERY`], each active session of the shards held
/// whose wall-clock budget ran out, with its subtree (end reason `budget`,
/// audited, fenced by its shard's term), and has the driver stop their
/// agents.
async fn deadlines<S: Store>(store: S, driver: Arc<Driver<S>>, cancel: CancellationToken) {
    let mut every = tokio::time::interval(DEADLINES_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = cancel.cancelled() => return,
        }
        let (shards, _) = driver.terms().live();
        if shards.is_empty() {
            continue;
        }
        let due = match store.over_deadline(now_ms(), shards).await {
            Ok(due) => due,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the wall-clock budgets");
                continue;
            }
        };
        for (shard, session_id) in due {
            let Some(term) = driver.terms().of(shard) else {
                continue;
            };
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
                    driver.stop_in(&term, ended);
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
