//! The MCP bridge's tests, one test binary: one module per former test
//! file or directory (`bridge/` is the bridge driven by the MCP Python
//! SDK, `demo_agent/` the scripted agent), `common` the harness they
//! share. One binary links the session service once rather than once per
//! file. `cargo test -p troupe-mcp-bridge --test mcp -- groups::` runs one
//! module.
//!
//! A new test file needs its `mod` line here: Cargo.toml has
//! `autotests = false`, so nothing else builds it.

#[path = "bridge/main.rs"]
mod bridge;
mod budgets;
mod claude_input;
mod common;
mod configuration;
#[path = "demo_agent/main.rs"]
mod demo_agent;
mod endpoints;
mod flags_doc;
mod group_refusals;
mod groups;
mod hostile_http;
mod message_refusals;
mod outages;
mod results;
mod revocation;
mod shutdown;
mod stdio;
mod tool_answers;
mod traces;
mod tree_refusals;
mod write_scopes;
