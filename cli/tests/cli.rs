//! The `troupe` command line's tests, one test binary: one module per
//! former test file or directory, each driving the binary against a real
//! session service. One binary links the service once rather than once
//! per file. `cargo test -p troupe-cli --test cli -- commands::` runs one
//! module.
//!
//! A new test file needs its `mod` line here: Cargo.toml has
//! `autotests = false`, so nothing else builds it.

mod agents;
#[path = "commands/main.rs"]
mod commands;
mod endpoints;
mod flags_doc;
mod results;
mod runners;
mod terminal;
mod tree_costs;
