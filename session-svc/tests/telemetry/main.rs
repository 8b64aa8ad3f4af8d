//! The `troupe-session` binary's telemetry, at a real OTLP receiver (the
//! services of `opentelemetry-proto`, on loopback), configured only by the
//! standard `OTEL_*` variables: request and spawn spans, each spawn tree as
//! one trace of session lives, metrics (also scraped as Prometheus would);
//! nothing exported without the variables; serving as usual when the
//! receiver is down.

use troupe_proto::session::{
    CreateRootSessionRequest, CreateSessionRequest, GetSessionRequest, TrustLevel,
};
use troupe_tests::{
    otlp::{Receiver, life_of, lookup, named, sample, scrape, spawn_of},
    process::SessionProcess,
};

mod export;
mod metrics;
mod spans;
mod traces;

/// Starts the `troupe-session` binary with `flags` and `env`.
fn start(flags: &[&str], env: &[(&str, &str)]) -> SessionProcess {
    SessionProcess::start(env!("CARGO_BIN_EXE_troupe-session"), flags, env)
}

/// Starts the `troupe-session` binary with `flags`, exporting to
/// `endpoint`, named by `OTEL_EXPORTER_OTLP_ENDPOINT` alone.
fn exporting(endpoint: &str, flags: &[&str]) -> SessionProcess {
    start(flags, &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)])
}
