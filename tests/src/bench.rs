//! Measuring helpers shared by the benchmarks: sequential calls after a
//! warm-up, a no-op call to measure beside them, and their percentiles;
//! model API calls through a gateway ([`api`]).

pub mod api;

use std::{
    future::Future,
    net::SocketAddr,
    time::{Duration, Instant},
};

use tonic::transport::Channel;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// Raises a benchmark server's spawn limits so that nothing is refused
/// (depth excepted) and the spawn rate is unlimited.
pub fn unlimited(config: &mut troupe_session_svc::Config) {
    config.limits.max_children = u32::MAX;
    config.limits.max_tree_sessions = u32::MAX;
    config.limits.max_active_per_workspace = u32::MAX;
    config.limits.spawn_rate_per_sec = 0.0;
    config.messaging.message_rate_per_sec = 0.0;
    config.messaging.max_fan_out = u32::MAX;
}

/// A gRPC call that does no work (a health check), on a connection of its
/// own to a server: the floor to set beside measured calls.
#[derive(Clone)]
pub struct Noop(HealthClient<Channel>);

impl Noop {
    pub async fn connect(addr: SocketAddr) -> Self {
        let channel = troupe_proto::endpoint::connect(&format!("http://{addr}"))
            .await
            .expect("connect");
        Self(HealthClient::new(channel))
    }

    pub async fn call(&self) {
        self.0
            .clone()
            .check(HealthCheckRequest::default())
            .await
            .expect("health");
    }
}

/// The `p`th percentile (0-100) of `sorted` by nearest rank.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> T {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Runs `call(i)` `samples` times one after another, after `samples / 10`
/// uncounted warm-up calls; returns the p50 and p99 of the counted ones.
pub async fn measure<F, Fut>(samples: usize, call: F) -> (Duration, Duration)
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = ()>,
{
    let (call, _) = measure_beside(samples, call, || async {}).await;
    call
}

/// As [`measure`], with `floor()` run and timed after each call: a call
/// that does no work, interleaved so that it meets the same moments of the
/// machine. Returns the call's p50 and p99, then the floor's.
pub async fn measure_beside<F, Fut, G, GFut>(
    samples: usize,
    mut call: F,
    mut floor: G,
) -> ((Duration, Duration), (Duration, Duration))
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = ()>,
    G: FnMut() -> GFut,
    GFut: Future<Output = ()>,
{
    for i in 0..samples / 10 {
        call(i).await;
        floor().await;
    }
    let mut calls = Vec::with_capacity(samples);
    let mut floors = Vec::with_capacity(samples);
    for i in 0..samples {
        let start = Instant::now();
        call(samples / 10 + i).await;
        calls.push(start.elapsed());
        let start = Instant::now();
        floor().await;
        floors.push(start.elapsed());
    }
    let p50_p99 = |mut times: Vec<Duration>| {
        times.sort();
        (percentile(&times, 50.0), percentile(&times, 99.0))
    };
    (p50_p99(calls), p50_p99(floors))
}

/// A duration in milliseconds, three decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}
