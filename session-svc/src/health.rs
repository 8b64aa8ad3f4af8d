//! Health that follows the database. Every [`PROBE_EVERY`] the service
//! reads the newest event id, with a deadline ([`PROBE_DEADLINE`]); while
//! that fails, the gRPC health service reports NOT_SERVING and every
//! Troupe call fails at once with UNAVAILABLE ([`FailFast`]) instead of
//! waiting out its client's deadline on a pool that cannot connect; the
//! first probe that succeeds reports SERVING again. Health checks,
//! reflection, the gateway and the console are not cut short: the gateway
//! and the console answer in their own shapes, from the same database.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use tokio_util::sync::CancellationToken;
use tonic::codegen::http;
use troupe_proto::drain::Drain;

use crate::store::Store;

/// How often the database is probed.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long a probe may take before the database counts as unreachable.
pub const PROBE_DEADLINE: Duration = Duration::from_secs(2);

/// Whether the last probe reached the database; shared by the probe and
/// [`FailFast`].
#[derive(Clone, Debug)]
pub struct Reachable(Arc<AtomicBool>);

impl Default for Reachable {
    fn default() -> Self {
        Reachable(Arc::new(AtomicBool::new(true)))
    }
}

impl Reachable {
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self, reachable: bool) -> bool {
        self.0.swap(reachable, Ordering::Relaxed) != reachable
    }
}

/// Probes the database until `cancel`, reporting what it finds through
/// `drain`'s health and `reachable`.
pub async fn follow<S: Store>(
    store: S,
    drain: Drain,
    reachable: Reachable,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = cancel.cancelled() => return,
        }
        let probe = tokio::time::timeout(PROBE_DEADLINE, store.event_heads()).await;
        let ok = matches!(probe, Ok(Ok(_)));
        if !reachable.set(ok) || drain.stopping() {
            continue;
        }
        if ok {
            tracing::info!("the database answers again: SERVING");
            drain.serving().await;
        } else {
            let why = match probe {
                Ok(Err(e)) => e.to_string(),
                _ => format!("no answer in {PROBE_DEADLINE:?}"),
            };
            tracing::error!(error = %why, "the database cannot be reached: NOT_SERVING, calls fail with UNAVAILABLE");
            drain.not_serving().await;
        }
    }
}

/// The message of a call refused while the database cannot be reached.
pub const UNREACHABLE: &str = "the session service cannot reach its database; try again shortly";

/// A tower layer that answers Troupe's own gRPC calls UNAVAILABLE at once
/// while the database cannot be reached.
#[derive(Clone)]
pub struct FailFast(pub Reachable);

impl<S> tower::Layer<S> for FailFast {
    type Service = FailFastService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FailFastService {
            inner,
            reachable: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct FailFastService<S> {
    inner: S,
    reachable: Reachable,
}

/// Troupe's services, by their gRPC path (health and reflection are not).
fn is_troupes(path: &str) -> bool {
    path.starts_with("/troupe.")
}

impl<S, B> tower::Service<http::Request<B>> for FailFastService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        futures::future::Either<S::Future, std::future::Ready<Result<Self::Response, Self::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if !self.reachable.get() && is_troupes(request.uri().path()) {
            let refused = tonic::Status::unavailable(UNREACHABLE).into_http();
            return futures::future::Either::Right(std::future::ready(Ok(refused)));
        }
        futures::future::Either::Left(self.inner.call(request))
    }
}
