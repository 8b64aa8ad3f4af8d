//! `troupe agent apply|list|rm` against a real session service: a
//! definition applied from a file is listed (as a table and as JSON),
//! replaced, used by a create, and removed; an invalid file is refused with
//! the parser's message; what a definition holds reaches the terminal only
//! escaped.

use std::process::{Command, Output};

use serde_json::Value;
use troupe_tests::{OPERATOR_TOKEN, TestServer};

const TROUPE: &str = env!("CARGO_BIN_EXE_troupe");

/// The CLI, pointed at `server` with the operator token in the environment.
fn troupe(server: &TestServer, data: &std::path::Path) -> Command {
    let mut command = Command::new(TROUPE);
    command
        .env("TROUPE_ENDPOINT", format!("http://{}", server.addr))
        .env("TROUPE_OPERATOR_TOKEN", OPERATOR_TOKEN)
        .env("TROUPE_DATA_DIR", data)
        .env_remove("TROUPE_TOKEN");
    command
}

/// Runs `troupe <args>` to its end on a blocking thread.
async fn run(mut command: Command, args: &[&str]) -> Output {
    command.args(args);
    tokio::task::spawn_blocking(move || command.output().expect("troupe runs"))
        .await
        .expect("joined")
}

/// Runs a command that must succeed; returns its stdout.
async fn ok(command: Command, args: &[&str]) -> String {
    let output = run(command, args).await;
    assert!(
        output.status.success(),
        "troupe {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Fails if `text` holds a control character other than a newline, or a bidi control.
fn assert_terminal_safe(what: &str, text: &str) {
    let bad: Vec<char> = text
        .chars()
        .filter(|&c| {
            (c.is_control() && c != '\n')
                || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect();
    assert!(bad.is_empty(), "{what} printed {bad:?} raw:\n{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_apply_list_and_rm_manage_the_databases_definitions() {
    let server = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("reviewer.md");
    let path = file.to_str().unwrap();
    std::fs::write(
        &file,
        "---\nname: reviewer\ndescription: Reviews code\ncommand: [\"/bin/echo\", \"one\"]\n---\nYou review code.\n",
    )
    .unwrap();

    let applied = json(
        &ok(
            troupe(&server, dir.path()),
            &["agent", "apply", path, "--workspace", "alpha", "--json"],
        )
        .await,
    );
    assert_eq!(applied["name"], "reviewer");
    assert_eq!(applied["workspace_id"], "alpha");
    assert_eq!(applied["command"], serde_json::json!(["/bin/echo", "one"]));
    assert_eq!(applied["description"], "Reviews code");

    // Replaced, and one for every workspace beside it.
    std::fs::write(
        &file,
        "---\ncommand: [\"/bin/echo\", \"two\"]\n---\nYou review code.\n",
    )
    .unwrap();
    let text = ok(
        troupe(&server, dir.path()),
        &["agent", "apply", path, "--workspace", "alpha"],
    )
    .await;
    assert_eq!(
        text,
        "applied agent reviewer for workspace alpha\ncommand /bin/echo two\n"
    );
    let text = ok(troupe(&server, dir.path()), &["agent", "apply", path]).await;
    assert!(
        text.starts_with("applied agent reviewer for every workspace\n"),
        "{text}"
    );

    let table = ok(troupe(&server, dir.path()), &["agent", "list"]).await;
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(lines[0].starts_with("WORKSPACE  NAME      RUNS"), "{table}");
    assert!(
        lines[1].starts_with("*          reviewer  command /bin/echo two"),
        "{table}"
    );
    assert!(
        lines[2].starts_with("alpha      reviewer  command /bin/echo two"),
        "{table}"
    );
    let listed = json(
        &ok(
            troupe(&server, dir.path()),
            &["agent", "list", "--workspace", "alpha", "--json"],
        )
        .await,
    );
    let listed = listed.as_array().expect("an array");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["workspace_id"], "alpha");
    assert_eq!(
        listed[0]["command"],
        serde_json::json!(["/bin/echo", "two"])
    );

    // A create in alpha uses it.
    let session = json(
        &ok(
            troupe(&server, dir.path()),
            &[
                "session",
                "create",
                "--workspace",
                "alpha",
                "--agent",
                "reviewer",
                "--json",
            ],
        )
        .await,
    );
    let id = session["session"]["session_id"].as_str().expect("an id");
    assert_eq!(
        server.stored_command(id).await,
        ["/bin/echo".to_owned(), "two".to_owned()]
    );

    let text = ok(
        troupe(&server, dir.path()),
        &["agent", "rm", "reviewer", "--workspace", "alpha"],
    )
    .await;
    assert_eq!(text, "removed agent reviewer for workspace alpha\n");
    let again = run(
        troupe(&server, dir.path()),
        &["agent", "rm", "reviewer", "--workspace", "alpha", "--json"],
    )
    .await;
    assert!(!again.status.success());
    let error = json(&String::from_utf8_lossy(&again.stdout));
    assert_eq!(error["error"]["reason"], "AGENT_NOT_FOUND");
    assert_eq!(error["error"]["code"], "NOT_FOUND");
    ok(troupe(&server, dir.path()), &["agent", "rm", "reviewer"]).await;
    let table = ok(troupe(&server, dir.path()), &["agent", "list"]).await;
    assert_eq!(table.lines().count(), 1, "only the header: {table}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invalid_file_is_refused_with_the_parsers_message() {
    let server = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("reviewer.md");
    std::fs::write(&file, "---\nname: reviewer\n---\nNo command.\n").unwrap();
    let output = run(
        troupe(&server, dir.path()),
        &["agent", "apply", file.to_str().unwrap()],
    )
    .await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "agent definition \"reviewer\" is invalid: the front matter has no `command` nor `runtime`"
        ) && stderr.contains("AGENT_INVALID"),
        "{stderr}"
    );
    let table = ok(troupe(&server, dir.path()), &["agent", "list"]).await;
    assert_eq!(table.lines().count(), 1, "nothing stored: {table}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn what_a_definition_holds_is_printed_escaped() {
    let server = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hostile.md");
    // YAML escapes: OSC retitle ended by BEL, clear screen, carriage
    // return, bidi override, newline.
    std::fs::write(
        &file,
        "---\ndescription: \"A\\e]0;owned\\aB\\e[2J\\rC\\u202eD\\nforged\"\ncommand: [\"/bin/echo\", \"\\e[31mred\"]\n---\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    for args in [
        vec!["agent", "apply", path],
        vec!["agent", "apply", path, "--json"],
        vec!["agent", "list"],
        vec!["agent", "list", "--json"],
    ] {
        let text = ok(troupe(&server, dir.path()), &args).await;
        assert_terminal_safe(&format!("{args:?}"), &text);
    }
    let table = ok(troupe(&server, dir.path()), &["agent", "list"]).await;
    assert_eq!(table.lines().count(), 2, "one line per definition: {table}");
    assert!(table.contains("owned"), "{table}");
    server.stop().await;
}
