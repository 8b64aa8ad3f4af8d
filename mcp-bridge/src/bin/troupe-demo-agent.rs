//! `troupe-demo-agent`: a scripted agent for demos and end-to-end tests. It
//! reads a plan from its first stdin message, acts on it through
//! `troupe-mcp` as a real MCP client, and reports each step as one JSON line
//! on stdout. See [`demo`] for the plan and the events.

#[path = "../demo/mod.rs"]
mod demo;

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    demo::run().await
}
