//! The runners the driver drives: the store's list of them (the embedded
//! `--runner` and those that register), a client of each by its stored
//! endpoint, and the reconciliation of each runner once per term and again
//! whenever it registers anew (a new generation: back after its lease
//! lapsed, or at a new endpoint).

use std::{collections::HashMap, sync::Arc};

use troupe_proto::runner::runner_service_client::RunnerServiceClient;

use super::{Client, Driver, Job, RETRY, Term};
use crate::{
    error::SessionError,
    model::{RunnerName, RunnerRow, SessionId},
    store::Store,
};

/// What the driver knows of the runners.
#[derive(Default)]
pub(super) struct Fleet {
    /// As last read from the store.
    rows: Vec<RunnerRow>,
    /// A client of each runner, with the endpoint it was made for.
    clients: HashMap<RunnerName, (String, Client)>,
    /// The generation of each runner reconciled, and in which term (epoch).
    reconciled: HashMap<RunnerName, (i64, i64)>,
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

    /// Reconciles, in the background, each live runner not yet reconciled
    /// at its current generation in this term (one task per runner).
    pub(super) fn reconcile_runners(self: &Arc<Self>, term: &Term, rows: &[RunnerRow]) {
        let epoch = term.fence().epoch;
        for row in rows.iter().filter(|r| r.live) {
            let done = {
                let fleet = self.runners.lock().expect("poisoned");
                fleet.reconciled.get(&row.name) == Some(&(epoch, row.generation))
            };
            if done || !self.claim(Job::Reconcile, row.name.as_str()) {
                continue;
            }
            let driver = self.clone();
            let term = term.clone();
            let row = row.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = driver.reconcile_until_done(&term, &row) => {}
                    () = term.cancelled() => {}
                }
                driver.release(Job::Reconcile, row.name.as_str());
            });
        }
    }

    /// Reconciles `row`'s runner until it answers, or its lease or the
    /// term ends.
    async fn reconcile_until_done(self: &Arc<Self>, term: &Term, row: &RunnerRow) {
        while term.live() && self.is_live(&row.name) {
            match self.reconcile_runner(term, &row.name).await {
                Ok(()) => {
                    let mut fleet = self.runners.lock().expect("poisoned");
                    fleet
                        .reconciled
                        .insert(row.name.clone(), (term.fence().epoch, row.generation));
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
