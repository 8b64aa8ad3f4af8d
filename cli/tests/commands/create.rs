//! What `session create` gives a session (a budget, a write scope, a
//! parent-end policy), what it refuses before any call, and how `session
//! get`, `list` and `tree` show it.

use super::*;

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
    let root = session_id(&created);
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

    let mut text = troupe_text(&server, data.path());
    text.args(["session", "get", &root]);
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
    let root = session_id(&created);
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
    let mut text = troupe_text(&server, data.path());
    text.args(["session", "get", &root]);
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
    let text = |line: &str| args(troupe_text(&server, data.path()), line);
    let root = session_id(
        &ok(args(
            cli(),
            "session create --workspace alpha --agent worker",
        ))
        .await,
    );
    let mid = session_id(
        &ok(args(
            cli(),
            &format!("session create --parent {root} --agent worker"),
        ))
        .await,
    );
    let mut kids = Vec::new();
    for policy in ["terminate", "abandon", "notify"] {
        let created = ok(args(
            cli(),
            &format!("session create --parent {mid} --agent worker --on-parent-end {policy}"),
        ))
        .await;
        assert_eq!(created["session"]["on_parent_end"], policy, "{created}");
        assert_eq!(created["session"]["orphaned"], false);
        kids.push(session_id(&created));
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
