//! The `troupe-session` binary's tests, one test binary: one module per
//! former test file or directory (its flags, shutdown, listeners, the
//! operator token, the gateway as a process, telemetry). One binary links
//! the service once rather than once per file.
//! `cargo test -p troupe-session-svc --test service -- operator_token::`
//! runs one module (`scripts/test` runs it again on PostgreSQL so).
//!
//! A new test file needs its `mod` line here: Cargo.toml has
//! `autotests = false`, so nothing else builds it.

mod flags_doc;
mod gateway_process;
mod hostile_listeners;
mod operator_token;
mod shutdown;
#[path = "telemetry/main.rs"]
mod telemetry;
