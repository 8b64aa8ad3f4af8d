//! Watches the Docker engine: pings it every [`PING_EVERY`] and reports what
//! it finds, as the runner's gRPC health (`NOT_SERVING` while the engine does
//! not answer, `SERVING` again once it does) and to the runner itself
//! ([`Engine::is_reachable`]: starts are refused as `UNAVAILABLE` meanwhile,
//! and followers judge their execs without the engine). A runner started
//! while the engine does not answer starts `NOT_SERVING` ([`start`]).

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;
use tonic_health::{ServingStatus, server::HealthReporter};
use troupe_proto::runner::runner_service_server::RunnerServiceServer;

use crate::{docker::Engine, exec::Runner, service::Service};

/// How often the engine is pinged.
pub const PING_EVERY: Duration = Duration::from_millis(500);

/// Sets the health to what [`Engine::connect`] found (`NOT_SERVING` if the
/// engine did not answer), then watches the engine with [`run`] in a task
/// of its own. Called before the server serves: no check sees `SERVING`
/// for an engine that was never reached.
pub async fn start(runner: Arc<Runner>, health: HealthReporter, stop: CancellationToken) {
    if !runner.engine().is_reachable() {
        report(&health, ServingStatus::NotServing).await;
    }
    tokio::spawn(run(runner, health, stop));
}

/// Pings the engine until `stop` is cancelled, keeping the health of
/// `RunnerService` (and the server's overall health) and
/// [`Engine::is_reachable`] true to what it finds.
///
/// Once `stop` is cancelled nothing here sets `SERVING` again: the last
/// status it sets is `NOT_SERVING`, so a shutdown that cancels `stop`
/// before (or while) it sets `NOT_SERVING` itself is never overruled.
pub async fn run(runner: Arc<Runner>, health: HealthReporter, stop: CancellationToken) {
    let engine = runner.engine();
    let mut every = tokio::time::interval(PING_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reported = engine.is_reachable();
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stop.cancelled() => break,
        }
        let pinged = tokio::select! {
            pinged = engine.ping() => pinged,
            () = stop.cancelled() => break,
        };
        let reachable = pinged.is_ok();
        if reachable == reported {
            continue;
        }
        if stop.is_cancelled() {
            break;
        }
        reported = reachable;
        changed(engine, &health, pinged).await;
    }
    report(&health, ServingStatus::NotServing).await;
}

/// Sets the runner's health, the server's overall (`""`) with its service's:
/// a check that names no service is told as much as one that names it.
async fn report(health: &HealthReporter, status: ServingStatus) {
    let service = <RunnerServiceServer<Service> as tonic::server::NamedService>::NAME;
    for name in ["", service] {
        health.set_service_status(name, status).await;
    }
}

async fn changed(engine: &Engine, health: &HealthReporter, pinged: anyhow::Result<()>) {
    match pinged {
        Ok(()) => {
            tracing::info!("the docker engine answers again; serving");
            engine.set_reachable(true);
            report(health, ServingStatus::Serving).await;
        }
        Err(e) => {
            tracing::warn!(
                error = format!("{e:#}"),
                "the docker engine does not answer; not serving"
            );
            engine.set_reachable(false);
            report(health, ServingStatus::NotServing).await;
            // Whatever ran may be gone when the engine is back: each
            // workspace's container is checked again before its next exec.
            engine.forget_containers().await;
        }
    }
}
