//! The `troupe` binary against a real session service: every command with
//! `--json`, as an operator and as a session (`--token`), and a refusal as
//! the machine-readable error a script would read; a watch across a
//! restart; what `session create` gives (budgets, write scopes, parent-end
//! policies) and how the text output shows it; the operator's group
//! commands.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use troupe_proto::session::TrustLevel;
use troupe_tests::{OPERATOR_TOKEN, TestServer, child, create_child, lines::JsonLines};

mod create;
mod groups;
mod json;
mod watch;

const TROUPE: &str = env!("CARGO_BIN_EXE_troupe");

/// The CLI printing text, pointed at `server` with the operator token in
/// the environment and a data directory that holds no token file.
fn troupe_text(server: &TestServer, data: &std::path::Path) -> Command {
    let mut command = Command::new(TROUPE);
    command
        .env("TROUPE_ENDPOINT", format!("http://{}", server.addr))
        .env("TROUPE_OPERATOR_TOKEN", OPERATOR_TOKEN)
        .env("TROUPE_DATA_DIR", data)
        .env_remove("TROUPE_TOKEN")
        .env_remove("TROUPE_ON_PARENT_END");
    command
}

/// As [`troupe_text`], printing JSON (`--json`).
fn troupe(server: &TestServer, data: &std::path::Path) -> Command {
    let mut command = troupe_text(server, data);
    command.arg("--json");
    command
}

/// Runs a command to its end on a blocking thread (the server runs on this
/// test's runtime meanwhile).
async fn run(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().expect("troupe runs"))
        .await
        .expect("joined")
}

/// Runs a command that must succeed; returns its JSON output.
async fn ok(command: Command) -> Value {
    let output = run(command).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "troupe failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

/// `command` with the words of `line` as its arguments.
fn args(mut command: Command, line: &str) -> Command {
    command.args(line.split_whitespace());
    command
}

fn ids(sessions: &Value) -> Vec<&str> {
    let mut ids: Vec<&str> = sessions
        .as_array()
        .expect("an array")
        .iter()
        .map(|s| s["session_id"].as_str().expect("an id"))
        .collect();
    ids.sort_unstable();
    ids
}

/// The id of the session a `session create` made, from its JSON.
fn session_id(created: &Value) -> String {
    created["session"]["session_id"]
        .as_str()
        .expect("an id")
        .to_owned()
}
