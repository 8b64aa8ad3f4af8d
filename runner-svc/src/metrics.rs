//! The runner's metrics, on the meter provider
//! [`troupe_telemetry::init`] installed (OTLP export, Prometheus
//! scrape); no-ops without one.
//!
//! | instrument | kind | attributes |
//! |---|---|---|
//! | `troupe.exec.start.duration` | histogram, s | (from `StartExec` to the agent's process running) |
//! | `troupe.container.recreations` | counter | `troupe.recreation.cause` (`stopped`, `gone`) |
//! | `troupe.exec.log.dropped` | counter, By | (output dropped from exec logs to keep them within their bounds) |
//! | `troupe.relay.refused` | counter | `troupe.relay.cause` (`unreachable`: no session endpoint accepted it; `limit`: past `--relay-max-connections`) |
//! | `troupe.relay.open` | up-down counter | (agents' connections relayed to the session service now) |

use std::{sync::LazyLock, time::Duration};

use opentelemetry::{
    KeyValue,
    metrics::{Counter, Histogram, UpDownCounter},
};

/// Upper bounds of the exec start buckets, in seconds (a first exec in a
/// workspace creates its container).
const START_BUCKETS: [f64; 11] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 10.0,
];

struct Instruments {
    start: Histogram<f64>,
    recreations: Counter<u64>,
    dropped: Counter<u64>,
    relay_refused: Counter<u64>,
    relay_open: UpDownCounter<i64>,
}

/// Made on first use, from the provider installed by then.
static INSTRUMENTS: LazyLock<Instruments> = LazyLock::new(|| {
    let meter = opentelemetry::global::meter("troupe-runner");
    Instruments {
        start: meter
            .f64_histogram("troupe.exec.start.duration")
            .with_unit("s")
            .with_description("Time from StartExec to the agent's process running")
            .with_boundaries(START_BUCKETS.to_vec())
            .build(),
        recreations: meter
            .u64_counter("troupe.container.recreations")
            .with_description(
                "Workspace containers created again because the one there had stopped or vanished",
            )
            .build(),
        dropped: meter
            .u64_counter("troupe.exec.log.dropped")
            .with_unit("By")
            .with_description(
                "Bytes of output dropped from exec logs to keep them within their bounds",
            )
            .build(),
        relay_refused: meter
            .u64_counter("troupe.relay.refused")
            .with_description(
                "Agents' connections the relay closed unrelayed: no session endpoint accepted one, or the relay was at its limit",
            )
            .build(),
        relay_open: meter
            .i64_up_down_counter("troupe.relay.open")
            .with_description("Agents' connections relayed to the session service now")
            .build(),
    }
});

/// Records an exec that took `elapsed` to start.
pub fn exec_started(elapsed: Duration) {
    INSTRUMENTS.start.record(elapsed.as_secs_f64(), &[]);
}

/// Records a workspace container recreated, because the one there had
/// `stopped`, was `gone`, or was made otherwise (`outdated`).
pub fn container_recreated(cause: &'static str) {
    INSTRUMENTS
        .recreations
        .add(1, &[KeyValue::new("troupe.recreation.cause", cause)]);
}

/// Records `bytes` of an exec's log dropped to keep it within its bounds.
pub fn log_dropped(bytes: u64) {
    INSTRUMENTS.dropped.add(bytes, &[]);
}

/// Why the relay closed an agent's connection without relaying it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelayRefusal {
    /// No session endpoint accepted a connection.
    Unreachable,
    /// The relay was at `--relay-max-connections`.
    Limit,
}

impl RelayRefusal {
    fn as_str(self) -> &'static str {
        match self {
            RelayRefusal::Unreachable => "unreachable",
            RelayRefusal::Limit => "limit",
        }
    }
}

/// Records an agent's connection the relay closed unrelayed.
pub fn relay_refused(cause: RelayRefusal) {
    INSTRUMENTS
        .relay_refused
        .add(1, &[KeyValue::new("troupe.relay.cause", cause.as_str())]);
}

/// One relayed connection, counted in `troupe.relay.open` until dropped.
pub struct RelayOpen(());

/// Counts a relayed connection open until the guard returned is dropped.
pub fn relay_opened() -> RelayOpen {
    INSTRUMENTS.relay_open.add(1, &[]);
    RelayOpen(())
}

impl Drop for RelayOpen {
    fn drop(&mut self) {
        INSTRUMENTS.relay_open.add(-1, &[]);
    }
}
