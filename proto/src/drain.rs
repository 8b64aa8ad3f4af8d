//! How a Troupe server stops, whatever its clients do.
//!
//! When the stop signal comes, [`Drain::begin`] first reports NOT_SERVING
//! for every service (so health checks and health watchers learn it before
//! anything else), then ends every open stream: the health watches served
//! by [`Drain::health_service`] after they have delivered NOT_SERVING, and
//! the server's own streams, which follow [`Drain::streams`]. Each ends
//! with UNAVAILABLE and a message that says to resume. The server stops
//! accepting at the same moment (its shutdown signal is the same token), and
//! [`Drain::bounded`] gives what is still open the drain time to finish,
//! then gives up on it.

use std::{pin::Pin, time::Duration};

use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tonic_health::{
    ServingStatus,
    pb::{HealthCheckRequest, HealthCheckResponse, health_server::Health as _},
    server::{HealthReporter, HealthService},
};

use crate::grpc::health::health_server::{Health, HealthServer};

/// Default time open calls get to finish once a server stops.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(5);

/// The message every stream ended by a stop carries.
pub const STOPPING: &str = "the server is shutting down; reconnect and resume";

/// A server's way to stop: its health, its streams, its drain time.
#[derive(Clone)]
pub struct Drain {
    health: HealthReporter,
    services: Vec<&'static str>,
    streams: CancellationToken,
    timeout: Duration,
}

impl Drain {
    /// A drain for the `services` (their gRPC names) `health` reports on;
    /// the server's overall status (`""`) is reported with them. Open
    /// streams end when `streams` is cancelled, by [`Drain::begin`] or by
    /// whoever else holds it.
    pub fn new(
        health: HealthReporter,
        services: &[&'static str],
        streams: CancellationToken,
        timeout: Duration,
    ) -> Self {
        let mut services = services.to_vec();
        services.push("");
        Drain {
            health,
            services,
            streams,
            timeout,
        }
    }

    /// The token every open stream of the server follows: cancelled, they end.
    pub fn streams(&self) -> &CancellationToken {
        &self.streams
    }

    /// Reports every service SERVING.
    pub async fn serving(&self) {
        for name in &self.services {
            self.health
                .set_service_status(name, ServingStatus::Serving)
                .await;
        }
    }

    /// Reports every service NOT_SERVING while the server still runs (its
    /// database cannot be reached, say); [`Drain::serving`] undoes it.
    /// After [`Drain::begin`], nothing is reported SERVING again by it.
    pub async fn not_serving(&self) {
        for name in &self.services {
            self.health
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
    }

    /// Whether the stop has begun.
    pub fn stopping(&self) -> bool {
        self.streams.is_cancelled()
    }

    /// The gRPC health service, whose watches end with UNAVAILABLE once the
    /// drain begins, after delivering the NOT_SERVING it reported. Served
    /// with Troupe's codec: a request it cannot decode is `INVALID_ARGUMENT`.
    pub fn health_service(&self) -> HealthServer<DrainingHealth> {
        HealthServer::new(DrainingHealth {
            inner: HealthService::from_health_reporter(self.health.clone()),
            stop: self.streams.clone(),
        })
    }

    /// Begins the stop: NOT_SERVING for every service, then every stream
    /// ends (and the servers that stop on [`Drain::streams`] stop accepting).
    pub async fn begin(&self) {
        for name in &self.services {
            self.health
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
        self.streams.cancel();
    }

    /// Runs `server` until it ends, or until the drain time has passed
    /// since the stop began: then what is still open is given up on and
    /// `None` is returned.
    pub async fn bounded<T>(&self, server: impl Future<Output = T>) -> Option<T> {
        let over = async {
            self.streams.cancelled().await;
            tokio::time::sleep(self.timeout).await;
        };
        tokio::select! {
            done = server => Some(done),
            () = over => {
                tracing::warn!(
                    drain_ms = self.timeout.as_millis() as u64,
                    "calls still open after the drain time; closing them"
                );
                None
            }
        }
    }
}

/// gRPC health whose watches end at a stop, once they have told it:
/// tonic-health's answers, behind a server generated with Troupe's codec.
pub struct DrainingHealth {
    inner: HealthService,
    stop: CancellationToken,
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for DrainingHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.inner.check(request).await
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let statuses = self.inner.watch(request).await?.into_inner();
        Ok(Response::new(until_stopped(statuses, self.stop.clone())))
    }
}

/// `items` until `stop`, then one UNAVAILABLE; an item that is ready when
/// the stop comes (the NOT_SERVING reported just before it) goes first.
fn until_stopped<T: Send + 'static>(
    items: impl Stream<Item = Result<T, Status>> + Send + 'static,
    stop: CancellationToken,
) -> Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>> {
    let items = Box::pin(items);
    Box::pin(futures::stream::unfold(
        Some((items, stop)),
        |state| async move {
            let (mut items, stop) = state?;
            tokio::select! {
                biased;
                item = items.next() => item.map(|item| (item, Some((items, stop)))),
                () = stop.cancelled() => Some((Err(Status::unavailable(STOPPING)), None)),
            }
        },
    ))
}
