//! Measuring helpers shared by the benchmarks: sequential calls after a
//! warm-up, and their percentiles.

use std::{
    future::Future,
    time::{Duration, Instant},
};

/// Raises a benchmark server's spawn limits so that nothing is refused
/// (depth excepted) and the spawn rate is unlimited.
pub fn unlimited(config: &mut troupe_session_svc::Config) {
    config.limits.max_children = u32::MAX;
    config.limits.max_tree_sessions = u32::MAX;
    config.limits.max_active_per_workspace = u32::MAX;
    config.limits.spawn_rate_per_sec = 0.0;
}

/// The `p`th percentile (0-100) of `sorted` by nearest rank.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Runs `call(i)` `samples` times one after another, after `samples / 10`
/// uncounted warm-up calls; returns the p50 and p99 of the counted ones.
pub async fn measure<F, Fut>(samples: usize, mut call: F) -> (Duration, Duration)
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = ()>,
{
    for i in 0..samples / 10 {
        call(i).await;
    }
    let mut times = Vec::with_capacity(samples);
    for i in 0..samples {
        let start = Instant::now();
        call(samples / 10 + i).await;
        times.push(start.elapsed());
    }
    times.sort();
    (percentile(&times, 50.0), percentile(&times, 99.0))
}

/// A duration in milliseconds, three decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}
