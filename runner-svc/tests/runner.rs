//! The runner's tests, one test binary: one module per former test file
//! or directory (execs and their containment, the pair of a runner and a
//! session service, the agent CLIs, fleets and replicas, the console in a
//! real browser, outages, the hostile workspace), `common` the harness
//! they share. One binary links the runner and the session service once
//! rather than once per file, so a rebuild takes a fraction of the time.
//! `cargo test -p troupe-runner-svc --test runner -- output::` runs one
//! module. Most need a Docker engine and the workspace image
//! (`scripts/docker-env`, `scripts/build-image`).
//!
//! A new test file needs its `mod` line here: Cargo.toml has
//! `autotests = false`, so nothing else builds it.

mod agent_team;
mod agent_turns;
#[path = "agents/main.rs"]
mod agents;
mod broadcast;
mod cancelled_start;
mod claude_faults;
mod claude_results;
mod claude_team;
mod common;
mod confinement;
#[path = "console/main.rs"]
mod console;
mod decoding;
#[path = "exec/main.rs"]
mod exec;
mod flags_doc;
mod fleet;
mod fleet_replicas;
mod gateway_keys;
mod hostile;
mod hostile_listener;
mod hostile_workspace;
mod log_bounds;
mod model;
#[path = "outages/main.rs"]
mod outages;
mod output;
mod parent_end;
mod paused_owner;
mod processes;
#[path = "relay/main.rs"]
mod relay;
mod restarts;
mod results;
mod shards;
mod shutdown;
mod stdin_frames;
mod stdin_takeover;
mod takeover;
mod traces;
mod write_scope;
