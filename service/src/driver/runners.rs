//! The runners the driver drives: the store's list of them (the embedded
//! `--runner` and those that register), a client of each by its stored
//! endpoint, and the reconciliation of each runner once per term of each
//! shard and again whenever it registers anew (a new generation: back after
//! its lease lapsed, or at a new endpoint).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use troupe_proto::runner::runner_service_client::RunnerServiceClient;

use super::{Client, Driver, Job, RETRY, Term};
use crate::{
    error::SessionError,
    model::{RunnerName, RunnerRow, SessionId},
    shard::Shard,
    store::Store,
};

/// What the driver knows of the runners.
#[derive(Default)]
pub(super) struct Fleet {
    /// As last read from the store.
    rows: Vec<RunnerRow>,
    /// A client of each runner, with the endpoint it was made for.
    clients: HashMap<RunnerName, (String, Client)>,
    /// The generation of each runner reconciled, and the terms (shard,
    /// epoch) it was reconciled in at that generation.
    reconciled: HashMap<RunnerName, (i64, HashSet<(Shard, i64)>)>,
}

impl<S: Store> Driver<S> {
    /// Reads the runners from the store, making a client for each new
    /// endpoint; returns them.
    pub(super) async fn refresh_runners(&self) -> Result<Vec<RunnerRow>, SessionError> {
        let rows = self.store.runners().await?;
        let mut fleet = self.runners.lock().expect("poisoned");
        for row in &rows {
            if fleet
                .clients
                .get(&row.name)
                .is_some_and(|(endpoint, _)| *endpoint == row.endpoint)
            {
                continue;
            }
            match troupe_proto::endpoint::connect_lazy(&row.endpoint) {
                Ok(channel) => {
                    let client = RunnerServiceClient::with_interceptor(channel, self.auth.clone())
                        .max_decoding_message_size(16 << 20);
                    fleet
                        .clients
                        .insert(row.name.clone(), (row.endpoint.clone(), client));
                }
                Err(e) => {
                    tracing::warn!(runner = %row.name, error = %e, "cannot reach the runner's endpoint")
                }
            }
        }
        fleet.rows.clone_from(&rows);
        Ok(rows)
    }

    /// Whether any runner may take work now (live, as last read).
    pub fn has_live_runner(&self) -> bool {
        let fleet = self.runners.lock().expect("poisoned");
        fleet.rows.iter().any(|r| r.live)
    }

    /// Whether there is a runner at all (the embedded one, or one that
    /// registered, live or not): read from the store, as any service may ask.
    pub async fn has_runner(&self) -> Result<bool, SessionError> {
        Ok(self.embedded.is_some() || !self.store.runners().await?.is_empty())
    }

    /// Whether `name` was live when last read.
    pub(super) fn is_live(&self, name: &RunnerName) -> bool {
        let fleet = self.runners.lock().expect("poisoned");
        fleet.rows.iter().any(|r| &r.name == name && r.live)
    }

    /// The client of runner `name`, reading the store again if it is new.
    pub(super) async fn runner_client(&self, name: &RunnerName) -> Option<Client> {
        let known = |driver: &Self| {
            let fleet = driver.runners.lock().expect("poisoned");
            fleet.clients.get(name).map(|(_, client)| client.clone())
        };
        if let Some(client) = known(self) {
            return Some(client);
        }
        if let Err(e) = self.refresh_runners().await {
            tracing::warn!(error = %e, "cannot read the runners");
        }
        known(self)
    }

    /// The runner a session's process was placed on, and its client.
    pub(super) async fn session_runner(
        &self,
        session_id: &SessionId,
    ) -> Result<Option<(RunnerName, Client)>, SessionError> {
        let Some(runner) = self.store.process(session_id).await?.and_then(|p| p.runner) else {
            return Ok(None);
        };
        Ok(self.runner_client(&runner).await.map(|c| (runner, c)))
    }

    /// Writes the embedded runner (`--runner`) into the store for `term`,
    /// or removes a stale one; nothing when the store has it already. On a
    /// shared database a service without `--runner` keeps the one another
    /// replica recorded (replicas without it drive it as well).
    pub(super) async fn set_embedded(&self, term: &Term) {
        if self.embedded.is_none() && self.shared_database {
            return;
        }
        if let Ok(rows) = self.store.runners().await {
            let stored: Vec<(&str, &str, u32)> = rows
                .iter()
                .filter(|r| r.is_static)
                .map(|r| (r.name.as_str(), r.endpoint.as_str(), r.capacity))
                .collect();
            let wanted: Vec<(&str, &str, u32)> = self
                .embedded
                .iter()
                .map(|e| (e.name.as_str(), e.endpoint.as_str(), e.capacity))
                .collect();
            if stored == wanted {
                return;
            }
        }
        let set = self
            .store
            .set_static_runner(term.fence(), self.embedded.as_ref())
            .await;
        if let Err(e) = term.check(set) {
            tracing::warn!(error = %e, "cannot record the embedded runner");
        }
    }

    /// Reconciles, in the background, each live runner for those of `terms`
    /// it was not yet reconciled in at its current generation (one task per
    /// runner at a time; terms that come meanwhile wait for the next pass).
    pub(super) fn reconcile_runners(self: &Arc<Self>, terms: &[Term], rows: &[RunnerRow]) {
        for row in rows.iter().filter(|r| r.live) {
            let due: Vec<Term> = {
                let fleet = self.runners.lock().expect("poisoned");
                let done = fleet
                    .reconciled
                    .get(&row.name)
                    .filter(|(generation, _)| *generation == row.generation)
                    .map(|(_, done)| done);
                terms
                    .iter()
                    .filter(|t| done.is_none_or(|d| !d.contains(&key(t))))
                    .cloned()
                    .collect()
            };
            if due.is_empty() || !self.claim(Job::Reconcile, row.name.as_str()) {
                continue;
            }
            let driver = self.clone();
            let row = row.clone();
            tokio::spawn(async move {
                // Ends once every one of its terms has.
                let ended =
                    futures::future::join_all(due.iter().map(|t| t.token().cancelled_owned()));
                tokio::select! {
                    () = driver.reconcile_until_done(&due, &row) => {}
                    _ = ended => {}
                }
                driver.release(Job::Reconcile, row.name.as_str());
            });
        }
    }

    /// Reconciles `row`'s runner for `terms` until it answers, or its lease
    /// or every one of the terms ends.
    async fn reconcile_until_done(self: &Arc<Self>, terms: &[Term], row: &RunnerRow) {
        loop {
            let live: Vec<Term> = terms.iter().filter(|t| t.live()).cloned().collect();
            if live.is_empty() || !self.is_live(&row.name) {
                return;
            }
            match self.reconcile_runner(&live, &row.name).await {
                Ok(()) => {
                    let mut fleet = self.runners.lock().expect("poisoned");
                    let entry = fleet
                        .reconciled
                        .entry(row.name.clone())
                        .or_insert_with(|| (row.generation, HashSet::new()));
                    if entry.0 != row.generation {
                        *entry = (row.generation, HashSet::new());
                    }
                    // A shard's older terms are forgotten.
                    entry
                        .1
                        .retain(|(shard, _)| !live.iter().any(|t| t.fence().shard == *shard));
                    entry.1.extend(live.iter().map(key));
                    return;
                }
                Err(e) => {
                    tracing::info!(runner = %row.name, error = %e, "runner not reachable yet; retrying")
                }
            }
            tokio::time::sleep(RETRY * 4).await;
        }
    }
}

/// A term as the reconciliation record names it.
fn key(term: &Term) -> (Shard, i64) {
    (term.fence().shard, term.fence().epoch)
}
