//! The bridge when the session service cannot be reached, driven by the MCP
//! Python SDK: every tool answers that nothing was done and to retry, the
//! endpoint named, whether nothing serves it or the endpoint list is
//! malformed; and a `wait_for_session` caught by an outage longer than its
//! retries polls until the service is back, and still sees the end it waits
//! for, or times out with the last view it had.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use troupe_proto::session::TrustLevel;
use troupe_tests::{TestServer, child, create_child, terminate};

/// Longer than the bridge's retries of a lone endpoint (twice, 200 ms apart).
const OUTAGE: Duration = Duration::from_millis(1500);

/// A call of every tool, with arguments the service would take.
fn every_tool() -> Vec<Value> {
    let id = json!("sess_00000000000000000000000000");
    vec![
        create("t", json!({})),
        call("send_message", json!({"session_id": id, "message": "m"})),
        call("list_workspace_sessions", json!({})),
        call("get_session", json!({"session_id": id})),
        call(
            "wait_for_session",
            json!({"session_id": id, "timeout_s": 5}),
        ),
        call("terminate_session", json!({"session_id": id})),
        call("report_progress", json!({"progress": 5})),
        call("finish", json!({"result": "r"})),
        call("reply_to_parent", json!({"message": "m"})),
        call("broadcast", json!({"message": "m"})),
        call("create_group", json!({"name": "g"})),
        call("add_to_group", json!({"group": "g", "session_ids": [id]})),
        call("post_to_group", json!({"group": "g", "message": "m"})),
        call("list_groups", json!({})),
    ]
}

/// Checks that `result` says the call was not done, why, and to retry.
fn not_done(result: &Value, endpoint: &str, why: &str) {
    assert_eq!(result["isError"], true, "{result}");
    let error = &result["structuredContent"]["error"];
    assert_eq!(error["code"], "UNAVAILABLE", "{error}");
    assert_eq!(error["source"], "bridge", "{error}");
    assert_eq!(error["reason"], Value::Null, "{error}");
    let text = result["content"][0]["text"].as_str().expect("text");
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("not done: cannot reach the session service"),
        "{text}"
    );
    assert!(first.contains(endpoint) && first.contains(why), "{text}");
    assert!(advice(result).contains("retry in a few seconds"), "{text}");
}

#[tokio::test]
async fn every_tool_says_nothing_was_done_while_the_service_cannot_be_reached() {
    // A socket in a directory that does not exist: nothing serves it.
    let nowhere = std::env::temp_dir().join(format!("troupe-nowhere-{}", std::process::id()));
    let dead = format!("unix://{}/session.sock", nowhere.display());
    let malformed = format!("{dead},,{dead}");
    let calls = every_tool();
    let mut called: Vec<&str> = calls.iter().map(|c| c["name"].as_str().unwrap()).collect();
    called.sort_unstable();
    let mut tools = TOOLS.to_vec();
    tools.sort_unstable();
    assert_eq!(called, tools, "every tool is called");
    let out = drive(vec![
        stdio(&dead, "a-token", calls.clone()),
        stdio(
            &malformed,
            "a-token",
            vec![
                call("list_workspace_sessions", json!({})),
                call("list_groups", json!({})),
            ],
        ),
    ])
    .await;
    let results = out[0]["results"].as_array().expect("results");
    assert_eq!(results.len(), calls.len());
    for result in results {
        not_done(result, &dead, "");
    }
    for result in out[1]["results"].as_array().expect("results") {
        not_done(result, &malformed, "empty endpoint");
    }
}

#[tokio::test]
async fn a_wait_polls_through_an_outage_longer_than_its_retries() {
    let mut server = TestServer::start().await;
    let endpoint = unix_endpoint(&server);
    let (root, mut as_root, token) = server.root("ws", TrustLevel::Direct).await;
    let ends = create_child(&mut as_root, child("ends")).await.session_id;
    let stays = create_child(&mut as_root, child("stays")).await.session_id;
    let wait = |id: &str, timeout_s: u64| {
        stdio(
            &endpoint,
            &token,
            vec![call(
                "wait_for_session",
                json!({"session_id": id, "timeout_s": timeout_s}),
            )],
        )
    };
    let waiting_for_end = spawn_client(vec![wait(&ends, 30)]).await;
    let timing_out = spawn_client(vec![wait(&stays, 8)]).await;
    let caller = format!("session:{}", root.session_id);
    for id in [&ends, &stays] {
        assert!(
            watches_opened(&server, id, &caller, 1).await,
            "the wait for {id} never opened its watch"
        );
    }

    // The service goes away for longer than the bridge retries, and comes back.
    server.stop_for_restart().await;
    tokio::time::sleep(OUTAGE).await;
    server.start_again().await;
    server
        .operator()
        .await
        .terminate_session(terminate(ends.as_str()))
        .await
        .expect("terminate after the outage");

    let out = finish_client(waiting_for_end).await;
    let ended = ok(&out[0]["results"][0]);
    assert_eq!(ended["timed_out"], false, "{ended}");
    assert_eq!(ended["session"]["status"], "terminated", "{ended}");
    assert!(ended["waited_s"].as_f64().unwrap() < 30.0, "{ended}");
    let out = finish_client(timing_out).await;
    let timed_out = ok(&out[0]["results"][0]);
    assert_eq!(timed_out["timed_out"], true, "{timed_out}");
    assert_eq!(timed_out["session"]["session_id"], stays.as_str());
    assert_eq!(timed_out["session"]["status"], "pending", "{timed_out}");
    server.stop().await;
}
