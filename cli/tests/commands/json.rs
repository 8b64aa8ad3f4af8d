//! Every command with `--json`, as an operator and as a session, and a
//! refusal as the JSON error a script reads; the watch's lines and the
//! audit trail of what was done.

use super::*;

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
    let root = session_id(&created);
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
    let kid = session_id(&made);
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
