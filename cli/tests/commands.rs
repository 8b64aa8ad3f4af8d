//! The `troupe` binary against a real session service: every command with
//! `--json`, as an operator and as a session (`--token`), and a refusal as
//! the machine-readable error a script would read.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use troupe_proto::session::TrustLevel;
use troupe_tests::{OPERATOR_TOKEN, TestServer, child, create_child};

const TROUPE: &str = env!("CARGO_BIN_EXE_troupe");

/// The CLI, pointed at `server` with the operator token in the environment
/// and a data directory that holds no token file.
fn troupe(server: &TestServer, data: &std::path::Path) -> Command {
    let mut command = Command::new(TROUPE);
    command
        .env("TROUPE_ENDPOINT", format!("http://{}", server.addr))
        .env("TROUPE_OPERATOR_TOKEN", OPERATOR_TOKEN)
        .env("TROUPE_DATA_DIR", data)
        .env_remove("TROUPE_TOKEN")
        .arg("--json");
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

#[tokio::test(flavor = "multi_thread")]
async fn every_command_speaks_json_to_a_real_service() {
    let server = TestServer::start().await;
    let data = tempfile::tempdir().expect("dir");
    let cli = || troupe(&server, data.path());

    // A root, with the trust level's alias, and its child on its behalf.
    let created = ok(args(
        cli(),
        "session create --workspace alpha --agent worker --title lead \
         --message hello --trust-level trusted",
    ))
    .await;
    let root = created["session"]["session_id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(created["session"]["trust_level"], "direct");
    assert!(
        created["session_token"]
            .as_str()
            .is_some_and(|t| !t.is_empty())
    );
    assert_eq!(created["quota"]["depth_remaining"], 2);
    let made = ok(args(
        cli(),
        &format!(
            "session create --parent {root} --agent worker --title helper --trust-level untrusted"
        ),
    ))
    .await;
    let kid = made["session"]["session_id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(made["session"]["parent_session_id"], root.as_str());
    assert_eq!(made["session"]["trust_level"], "sandboxed");
    assert_eq!(made["session"]["created_by"], "operator");
    let tree_id = made["session"]["tree_id"]
        .as_str()
        .expect("tree")
        .to_owned();

    let listed = ok(args(cli(), "session list --workspace alpha")).await;
    let mut both = vec![root.as_str(), kid.as_str()];
    both.sort_unstable();
    assert_eq!(ids(&listed), both);
    let got = ok(args(cli(), &format!("session get {kid}"))).await;
    assert_eq!(got["session"]["title"], "helper");
    let got = ok(args(cli(), &format!("session get {root}"))).await;
    assert_eq!(ids(&got["children"]), [kid.as_str()]);
    assert_eq!(got["inbox_count"], 1, "the initial message");
    let tree = ok(args(cli(), &format!("session tree {kid}"))).await;
    assert_eq!(
        tree["session_id"],
        root.as_str(),
        "the whole tree, from its root"
    );
    assert_eq!(ids(&tree["children"]), [kid.as_str()]);

    let sent = ok(args(cli(), &format!("session send {kid} --message work"))).await;
    assert_eq!(
        (sent["sequence"].as_u64(), sent["delivery"].as_str()),
        (Some(1), Some("queued"))
    );

    // Acting as the sandboxed child with its own token: it sees itself only.
    let token = ok(args(cli(), &format!("session token {kid}"))).await;
    let token = token["session_token"].as_str().expect("token").to_owned();
    let mut as_kid = cli();
    as_kid.args(["--token", &token]);
    let seen = ok(args(as_kid, "session list --workspace alpha")).await;
    assert_eq!(ids(&seen), [kid.as_str()]);

    // A refusal is a failure whose JSON names the rule.
    let mut as_kid = cli();
    as_kid.args(["--token", &token]);
    let refused = run(args(
        as_kid,
        &format!("session create --parent {kid} --agent worker --trust-level direct"),
    ))
    .await;
    assert!(!refused.status.success(), "an escalation is refused");
    let error: Value = serde_json::from_slice(&refused.stdout).expect("a JSON error");
    assert_eq!(error["error"]["reason"], "TRUST_ESCALATION", "{error}");

    let ended = ok(args(
        cli(),
        &format!("session terminate {root} --reason done"),
    ))
    .await;
    let mut ended_ids: Vec<&str> = ended["terminated_session_ids"]
        .as_array()
        .expect("ids")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    ended_ids.sort_unstable();
    assert_eq!(ended_ids, both);
    assert_eq!(ended["session"]["end_reason"], "done");

    // The tree's events from the start, one JSON line each, up to the end
    // of both sessions; a watch runs until it is stopped.
    let mut watch = cli()
        .args(["session", "watch", "--tree", &tree_id])
        .stdout(Stdio::piped())
        .spawn()
        .expect("watch runs");
    let stdout = watch.stdout.take().expect("stdout");
    let events = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut events = Vec::new();
        let mut terminated = 0;
        for line in BufReader::new(stdout).lines() {
            let event: Value = serde_json::from_str(&line.expect("a line")).expect("JSON line");
            terminated += usize::from(event["kind"] == "terminated");
            events.push(event);
            if terminated == 2 || Instant::now() > deadline {
                break;
            }
        }
        events
    })
    .await
    .expect("joined");
    let _ = watch.kill();
    let _ = watch.wait();
    let kinds: Vec<(&str, &str)> = events
        .iter()
        .map(|e| {
            (
                e["session_id"].as_str().unwrap_or(""),
                e["kind"].as_str().unwrap_or(""),
            )
        })
        .collect();
    for expected in [
        (root.as_str(), "created"),
        (kid.as_str(), "created"),
        (kid.as_str(), "message"),
        (root.as_str(), "terminated"),
        (kid.as_str(), "terminated"),
    ] {
        assert!(kinds.contains(&expected), "{expected:?} in {kinds:?}");
    }

    // The audit trail names the caller, the action, the target and the rule.
    let audit = ok(args(cli(), &format!("audit --session {kid}"))).await;
    let entries = audit.as_array().expect("entries");
    let refusal = entries
        .iter()
        .find(|e| e["allowed"] == false)
        .unwrap_or_else(|| panic!("the refusal is audited: {audit}"));
    assert_eq!(
        (&refusal["caller"], &refusal["action"], &refusal["reason"]),
        (
            &Value::from(format!("session:{kid}")),
            &Value::from("create_session"),
            &Value::from("TRUST_ESCALATION")
        )
    );
    assert!(
        entries.iter().any(|e| e["allowed"] == true
            && e["caller"] == "operator"
            && e["action"] == "send_message"
            && e["target"] == kid.as_str()),
        "the operator's message is audited: {audit}"
    );
    server.stop().await;
}

/// A watch outlives a restart of the service: it opens again after the last
/// cursor it printed, and sees what happened meanwhile once, in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_watch_resumes_across_a_restart_of_the_service() {
    let mut server = TestServer::start().await;
    let data = tempfile::tempdir().expect("dir");
    let (root, mut as_root, _) = server.root("alpha", TrustLevel::Direct).await;
    let mut watch = troupe(&server, data.path())
        .args(["session", "watch", "--tree", &root.tree_id])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("watch runs");
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let stdout = watch.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let event: Value = serde_json::from_str(&line).expect("a JSON line");
            if lines_tx.send(event).is_err() {
                break;
            }
        }
    });
    let next = async |lines: &mut tokio::sync::mpsc::UnboundedReceiver<Value>| {
        tokio::time::timeout(Duration::from_secs(30), lines.recv())
            .await
            .expect("an event within 30 s")
            .expect("the watch goes on")
    };
    let created = next(&mut lines).await;
    assert_eq!(created["kind"], "created");

    server.restart().await;
    // Made while the watch reconnects, or after: it sees them either way.
    let kid = create_child(&mut as_root, child("after the restart")).await;
    let mut seen = vec![created];
    while !seen
        .iter()
        .any(|e| e["session_id"] == kid.session_id.as_str())
    {
        seen.push(next(&mut lines).await);
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let cursors: Vec<u64> = seen.iter().filter_map(|e| e["cursor"].as_u64()).collect();
    assert!(
        cursors.windows(2).all(|w| w[0] < w[1]),
        "in order, none twice: {cursors:?}"
    );
    server.stop().await;
}

/// `session create --budget-*` gives a budget (USD converted exactly), which
/// `session get` shows with the deadline and the usage, as JSON and as
/// text; a child asking more than is left is refused BUDGET_EXCEEDED; an
/// amount that is not a plain non-negative decimal is refused before any call.
#[tokio::test(flavor = "multi_thread")]
async fn budgets_are_given_and_shown() {
    let server = TestServer::start().await;
    let data = tempfile::tempdir().expect("dir");
    let cli = || troupe(&server, data.path());
    let created = ok(args(
        cli(),
        "session create --workspace alpha --agent worker --budget-usd 2.50 \
         --budget-tokens 1000 --budget-calls 20 --budget-wall-secs 3600",
    ))
    .await;
    let root = created["session"]["session_id"]
        .as_str()
        .expect("id")
        .to_owned();
    let got = ok(args(cli(), &format!("session get {root}"))).await;
    let budget = &got["session"]["budget"];
    assert_eq!(budget["cost_pico_usd"], 2_500_000_000_000u64, "{got}");
    assert_eq!(budget["cost_usd"], "2.50");
    assert_eq!(
        (
            &budget["tokens"],
            &budget["model_calls"],
            &budget["wall_ms"]
        ),
        (
            &Value::from(1000),
            &Value::from(20),
            &Value::from(3_600_000)
        )
    );
    assert!(got["session"]["deadline"].is_string(), "{got}");
    assert_eq!(got["session"]["usage"]["subtree"]["cost_usd"], "0.00");
    assert_eq!(got["session"]["usage"]["own"]["calls"], 0);

    let mut text = Command::new(TROUPE);
    text.env("TROUPE_ENDPOINT", format!("http://{}", server.addr))
        .env("TROUPE_OPERATOR_TOKEN", OPERATOR_TOKEN)
        .env("TROUPE_DATA_DIR", data.path())
        .args(["session", "get", &root]);
    let output = run(text).await;
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(
        shown.contains("budget      $2.50, 1000 tokens, 20 calls, 3600s wall"),
        "{shown}"
    );
    assert!(shown.contains("usage       own 0 calls"), "{shown}");

    let refused = run(args(
        cli(),
        &format!("session create --parent {root} --agent worker --budget-tokens 1001"),
    ))
    .await;
    assert!(!refused.status.success());
    let error: Value = serde_json::from_slice(&refused.stdout).expect("JSON error");
    assert_eq!(error["error"]["reason"], "BUDGET_EXCEEDED", "{error}");
    assert_eq!(error["error"]["metadata"]["tokens_remaining"], "1000");

    for bad in ["-1", "1.2.3", "2.5e3", "0.0000000000001"] {
        let output = run(args(
            cli(),
            &format!("session create --workspace alpha --agent worker --budget-usd={bad}"),
        ))
        .await;
        assert!(!output.status.success(), "{bad} accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("--budget-usd"), "{bad}: {stderr}");
    }
    server.stop().await;
}

/// `session create --writable PATH` (repeated) gives a root its scope and a
/// child a narrower one; a wider child is refused SCOPE_ESCALATION; a path
/// outside /workspace is refused before any call.
#[tokio::test(flavor = "multi_thread")]
async fn write_scopes_are_given_and_only_narrow() {
    let server = TestServer::start().await;
    let data = tempfile::tempdir().expect("dir");
    let cli = || troupe(&server, data.path());
    let created = ok(args(
        cli(),
        "session create --workspace alpha --agent worker \
         --writable /workspace/src --writable /workspace/doc/",
    ))
    .await;
    let root = created["session"]["session_id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(
        server.stored_scope(&root).await,
        ["/workspace/doc", "/workspace/src"]
    );
    let child = ok(args(
        cli(),
        &format!("session create --parent {root} --agent worker --writable /workspace/src/a"),
    ))
    .await;
    assert_eq!(
        child["session"]["writable_paths"],
        serde_json::json!(["/workspace/src/a"])
    );
    let child = child["session"]["session_id"].as_str().expect("id");
    assert_eq!(server.stored_scope(child).await, ["/workspace/src/a"]);
    let mut text = Command::new(TROUPE);
    text.env("TROUPE_ENDPOINT", format!("http://{}", server.addr))
        .env("TROUPE_OPERATOR_TOKEN", OPERATOR_TOKEN)
        .env("TROUPE_DATA_DIR", data.path())
        .args(["session", "get", &root]);
    let shown = String::from_utf8_lossy(&run(text).await.stdout).into_owned();
    assert!(
        shown.contains("writable    /workspace/doc, /workspace/src\n"),
        "{shown}"
    );

    let refused = run(args(
        cli(),
        &format!("session create --parent {root} --agent worker --writable /workspace"),
    ))
    .await;
    assert!(!refused.status.success());
    let error: Value = serde_json::from_slice(&refused.stdout).expect("JSON error");
    assert_eq!(error["error"]["reason"], "SCOPE_ESCALATION", "{error}");

    let output = run(args(
        cli(),
        "session create --workspace alpha --agent worker --writable /etc",
    ))
    .await;
    assert!(!output.status.success(), "/etc accepted");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--writable") && stderr.contains("outside /workspace"),
        "{stderr}"
    );
    server.stop().await;
}

/// `session create --on-parent-end POLICY` gives a child its policy (an
/// unknown one is refused before any call); when its parent is terminated,
/// `session list` and `session tree` show the abandoned and notified
/// children running on as orphans, and `session get` their policy.
#[tokio::test(flavor = "multi_thread")]
async fn parent_end_policies_are_given_and_orphans_shown() {
    let server = TestServer::start().await;
    let data = tempfile::tempdir().expect("dir");
    let cli = || troupe(&server, data.path());
    let text = |line: &str| {
        let mut command = Command::new(TROUPE);
        command
            .env("TROUPE_ENDPOINT", format!("http://{}", server.addr))
            .env("TROUPE_OPERATOR_TOKEN", OPERATOR_TOKEN)
            .env("TROUPE_DATA_DIR", data.path())
            .env_remove("TROUPE_ON_PARENT_END")
            .args(line.split_whitespace());
        command
    };
    let id = |created: &Value| {
        created["session"]["session_id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let root = id(&ok(args(
        cli(),
        "session create --workspace alpha --agent worker",
    ))
    .await);
    let mid = id(&ok(args(
        cli(),
        &format!("session create --parent {root} --agent worker"),
    ))
    .await);
    let mut kids = Vec::new();
    for policy in ["terminate", "abandon", "notify"] {
        let created = ok(args(
            cli(),
            &format!("session create --parent {mid} --agent worker --on-parent-end {policy}"),
        ))
        .await;
        assert_eq!(created["session"]["on_parent_end"], policy, "{created}");
        assert_eq!(created["session"]["orphaned"], false);
        kids.push(id(&created));
    }
    let refused = run(args(
        cli(),
        &format!("session create --parent {mid} --agent worker --on-parent-end orphan"),
    ))
    .await;
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--on-parent-end"), "{stderr}");
    let shown = run(text(&format!("session get {}", kids[1]))).await;
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("parent end  abandon\n"), "{shown}");

    ok(args(cli(), &format!("session terminate {mid}"))).await;
    let listed = ok(args(cli(), "session list --workspace alpha")).await;
    let orphans: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["orphaned"] == true)
        .map(|s| s["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(orphans.len(), 2, "{listed}");
    assert!(orphans.contains(&kids[1].as_str()) && orphans.contains(&kids[2].as_str()));
    let table = run(text("session list --workspace alpha")).await;
    let table = String::from_utf8_lossy(&table.stdout);
    for orphan in &kids[1..] {
        let row = table.lines().find(|l| l.contains(orphan.as_str())).unwrap();
        assert!(row.contains("pending (orphaned)"), "{table}");
    }
    assert!(
        !table.contains(&kids[0]),
        "the terminated child is listed: {table}"
    );
    let tree = run(text(&format!("session tree {root}"))).await;
    let tree = String::from_utf8_lossy(&tree.stdout);
    let line = tree.lines().find(|l| l.contains(&kids[2])).unwrap();
    assert!(line.contains("(orphaned)"), "{tree}");
    server.stop().await;
}

/// `troupe group broadcast` and `troupe group list`: the operator's message
/// to a workspace, each recipient once, and the groups its sessions keep.
#[tokio::test]
async fn group_broadcast_reaches_each_active_session_once_and_list_shows_groups() {
    let server = TestServer::start().await;
    let data = tempfile::tempdir().expect("temp dir");
    let (a, mut as_a, _) = server.root("alpha", TrustLevel::Sandboxed).await;
    let (b, _, _) = server.root("alpha", TrustLevel::Direct).await;
    let (other, _, _) = server.root("beta", TrustLevel::Direct).await;
    as_a.create_group(troupe_proto::session::CreateGroupRequest {
        name: "pair".into(),
    })
    .await
    .expect("create group");

    let sent = ok(args(
        troupe(&server, data.path()),
        "group broadcast --workspace alpha --message hello --request-id once",
    ))
    .await;
    let mut reached: Vec<&str> = sent["recipients"]
        .as_array()
        .expect("recipients")
        .iter()
        .map(|r| {
            assert_eq!(r["outcome"], "delivered", "{r}");
            r["session_id"].as_str().expect("id")
        })
        .collect();
    reached.sort_unstable();
    let mut expected = [a.session_id.as_str(), b.session_id.as_str()];
    expected.sort_unstable();
    assert_eq!(reached, expected);
    let again = ok(args(
        troupe(&server, data.path()),
        "group broadcast --workspace alpha --message hello --request-id once",
    ))
    .await;
    assert_eq!(again, sent, "a retry answers the same");
    for (id, count) in [
        (&a.session_id, 2),
        (&b.session_id, 2),
        (&other.session_id, 1),
    ] {
        assert_eq!(server.get(id).await.inbox_count, count, "{id}");
    }

    let groups = ok(args(
        troupe(&server, data.path()),
        "group list --workspace alpha",
    ))
    .await;
    assert_eq!(groups[0]["name"], "pair", "{groups}");
    assert_eq!(groups[0]["member_ids"], serde_json::json!([a.session_id]));
    let none = ok(args(
        troupe(&server, data.path()),
        "group list --workspace beta",
    ))
    .await;
    assert_eq!(none, serde_json::json!([]));
}
