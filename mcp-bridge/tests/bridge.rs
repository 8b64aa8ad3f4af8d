//! `troupe-mcp` driven by a real MCP client, the official Python SDK
//! (`tests/mcp_client.py`), against a real session service in this process:
//! over stdio through the service's Unix socket, and as the shared HTTP
//! endpoint with each request's bearer token. Needs `python3` with
//! `mcp` 2.x installed; without it these tests fail, saying how to install it.

mod common;

use std::process::Stdio;

use common::*;
use serde_json::json;
use troupe_proto::session::TrustLevel;
use troupe_tests::{TestServer, get, terminate};

#[tokio::test]
async fn tools_list_shows_every_tool_with_its_schema() {
    let server = TestServer::start().await;
    let (_, _, token) = server.root("ws", TrustLevel::Direct).await;
    let mut connection = stdio(&unix_endpoint(&server), &token, vec![]);
    connection["list_tools"] = json!(true);
    let out = drive(vec![connection]).await;
    assert_eq!(out[0]["server_info"]["name"], "troupe-mcp");
    let tools = out[0]["tools"].as_array().expect("tools");
    let mut names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    names.sort();
    let mut expected = TOOLS.to_vec();
    expected.sort();
    assert_eq!(names, expected);
    let tool = |name: &str| tools.iter().find(|t| t["name"] == name).unwrap().clone();
    for t in tools {
        assert!(t["description"].as_str().unwrap().len() > 40, "{t}");
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
    }

    let create = tool("create_session");
    let schema = &create["inputSchema"];
    let mut required: Vec<&str> = schema["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    required.sort();
    assert_eq!(required, ["agent_name", "initial_message", "title"]);
    for field in [
        "title",
        "agent_name",
        "initial_message",
        "trust_level",
        "mode",
        "budget_usd",
        "budget_tokens",
        "budget_calls",
        "budget_wall_secs",
        "writable_paths",
        "on_parent_end",
    ] {
        let property = &schema["properties"][field];
        assert!(
            !property.is_null(),
            "create_session lacks {field}: {schema}"
        );
    }
    assert!(
        create["description"]
            .as_str()
            .unwrap()
            .contains("can only narrow this session's"),
        "{create}"
    );
    let schema_text = schema.to_string();
    for word in [
        "async",
        "sync",
        "callback",
        "sandboxed",
        "direct",
        "terminate",
        "abandon",
        "notify",
    ] {
        assert!(
            schema_text.contains(word),
            "{word} missing from {schema_text}"
        );
    }
    assert!(
        schema["properties"]["title"]["description"]
            .as_str()
            .is_some_and(|d| !d.is_empty())
    );

    let send = tool("send_message");
    assert_eq!(
        send["inputSchema"]["required"],
        json!(["session_id", "message"])
    );
    let wait = tool("wait_for_session");
    assert_eq!(wait["inputSchema"]["required"], json!(["session_id"]));
    assert!(!wait["inputSchema"]["properties"]["timeout_s"].is_null());
    assert_eq!(tool("get_session")["annotations"]["readOnlyHint"], true);
    assert_eq!(
        tool("terminate_session")["annotations"]["destructiveHint"],
        true
    );
    assert_eq!(
        tool("report_progress")["inputSchema"]["required"],
        json!(["progress"])
    );
    let finish = tool("finish");
    assert_eq!(finish["inputSchema"]["required"], json!(["result"]));
    let outcome = finish["inputSchema"]["properties"]["outcome"].to_string();
    assert!(
        outcome.contains("success") && outcome.contains("failure"),
        "{outcome}"
    );
    assert_eq!(
        tool("reply_to_parent")["inputSchema"]["required"],
        json!(["message"])
    );
    let broadcast = tool("broadcast");
    assert_eq!(broadcast["inputSchema"]["required"], json!(["message"]));
    let scope = broadcast["inputSchema"]["properties"]["scope"].to_string();
    for word in ["workspace", "subtree", "children"] {
        assert!(scope.contains(word), "{word} missing from {scope}");
    }
    assert_eq!(
        tool("post_to_group")["inputSchema"]["required"],
        json!(["group", "message"])
    );
    assert_eq!(
        tool("add_to_group")["inputSchema"]["required"],
        json!(["group", "session_ids"])
    );
    assert_eq!(tool("list_groups")["annotations"]["readOnlyHint"], true);
}

#[tokio::test]
async fn stdio_team_spawns_messages_lists_and_hits_the_depth_limit() {
    let server = TestServer::start().await;
    let endpoint = unix_endpoint(&server);
    let (root, _, root_token) = server.root("ws", TrustLevel::Direct).await;
    let root_id = root.session_id.as_str();

    // The root creates a (direct) child, messages it, and lists.
    let out = drive(vec![stdio(
        &endpoint,
        &root_token,
        vec![
            call(
                "create_session",
                json!({"title": "backend", "agent_name": "worker", "initial_message": "build the API"}),
            ),
            call("list_workspace_sessions", json!({})),
            call(
                "report_progress",
                json!({"progress": 30, "description": "team started"}),
            ),
            call("report_progress", json!({"progress": 101})),
        ],
    )])
    .await;
    // Progress is an event of the caller's own session; a bad value is
    // refused by the service, as a tool error naming the field.
    assert_eq!(
        ok(&out[0]["results"][2])["sequence"],
        3,
        "after created and message"
    );
    let text = refused(&out[0]["results"][3], "INVALID_ARGUMENT");
    assert!(text.contains("progress"), "{text}");
    let created = ok(&out[0]["results"][0]);
    let child_id = created["session"]["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(created["session"]["parent_session_id"], root_id);
    assert_eq!(created["session"]["depth"], 1);
    assert_eq!(created["session"]["trust_level"], "direct");
    assert_eq!(created["session"]["title"], "backend");
    assert_eq!(created["quota"]["depth_remaining"], 1);
    assert_eq!(
        ids(ok(&out[0]["results"][1])),
        sorted(&[root_id, &child_id])
    );

    // The child, with its own token, creates a sandboxed grandchild (by the
    // "untrusted" alias), messages its parent, and sees the whole workspace.
    let child_token = server.token_for(&child_id).await;
    let out = drive(vec![
        stdio(
            &endpoint,
            &child_token,
            vec![
                call(
                    "create_session",
                    json!({"title": "tests", "agent_name": "worker",
                           "initial_message": "write the tests", "trust_level": "untrusted",
                           "mode": "async"}),
                ),
                call(
                    "send_message",
                    json!({"session_id": root_id, "message": "started"}),
                ),
                call("list_workspace_sessions", json!({})),
            ],
        ),
        stdio(
            &endpoint,
            &root_token,
            vec![call(
                "send_message",
                json!({"session_id": child_id, "message": "use axum"}),
            )],
        ),
    ])
    .await;
    let grandchild = ok(&out[0]["results"][0]);
    let grandchild_id = grandchild["session"]["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        grandchild["session"]["parent_session_id"],
        child_id.as_str()
    );
    assert_eq!(grandchild["session"]["depth"], 2);
    assert_eq!(grandchild["session"]["trust_level"], "sandboxed");
    assert_eq!(grandchild["quota"]["depth_remaining"], 0);
    for sent in [&out[0]["results"][1], &out[1]["results"][0]] {
        let sent = ok(sent);
        assert!(
            ["queued", "delivered"].contains(&sent["delivery"].as_str().unwrap()),
            "{sent}"
        );
        assert_eq!(sent["sequence"], 2, "after the initial message: {sent}");
    }
    assert_eq!(
        ids(ok(&out[0]["results"][2])),
        sorted(&[root_id, &child_id, &grandchild_id])
    );
    assert_eq!(inbox_count(&server, root_id).await, 2);
    assert_eq!(inbox_count(&server, &child_id).await, 2);

    // The grandchild is at the depth limit, and sandboxed: it cannot spawn,
    // sees only itself, and cannot reach its direct parent.
    let grandchild_token = server.token_for(&grandchild_id).await;
    let out = drive(vec![stdio(
        &endpoint,
        &grandchild_token,
        vec![
            call(
                "create_session",
                json!({"title": "more", "agent_name": "worker", "initial_message": "go"}),
            ),
            call("list_workspace_sessions", json!({})),
            call(
                "send_message",
                json!({"session_id": child_id, "message": "hi"}),
            ),
            call("get_session", json!({"session_id": root_id})),
        ],
    )])
    .await;
    let results = &out[0]["results"];
    let depth = refused(&results[0], "DEPTH_EXCEEDED");
    assert!(
        depth.starts_with("refused by the session service: "),
        "{depth}"
    );
    assert!(depth.contains("depth_remaining=0"), "{depth}");
    // What is left of the tree counts the sessions a sandboxed caller may
    // see: itself, not its direct parent and root.
    assert!(depth.contains("tree_sessions_remaining=9"), "{depth}");
    assert!(depth.contains("cannot create children"), "{depth}");
    assert_eq!(
        results[0]["structuredContent"]["error"]["metadata"]["depth_remaining"],
        0
    );
    assert_eq!(ids(ok(&results[1])), vec![grandchild_id.clone()]);
    refused(&results[2], "SESSION_NOT_FOUND");
    refused(&results[3], "SESSION_NOT_FOUND");
    assert_eq!(
        inbox_count(&server, &child_id).await,
        2,
        "nothing was stored"
    );

    // The child waits for its grandchild: a short wait times out; a long one
    // ends when the grandchild is terminated meanwhile. Then the root ends
    // the child's subtree.
    let waiting = spawn_client(vec![
        stdio(
            &endpoint,
            &child_token,
            vec![
                call("get_session", json!({"session_id": grandchild_id})),
                call(
                    "wait_for_session",
                    json!({"session_id": grandchild_id, "timeout_s": 0.3}),
                ),
                call(
                    "wait_for_session",
                    json!({"session_id": grandchild_id, "timeout_s": 30}),
                ),
                call("terminate_session", json!({"session_id": grandchild_id})),
            ],
        ),
        stdio(
            &endpoint,
            &root_token,
            vec![
                call("terminate_session", json!({"session_id": child_id})),
                call("get_session", json!({"session_id": child_id})),
            ],
        ),
    ])
    .await;
    // Terminate once the second wait is watching.
    let caller = format!("session:{child_id}");
    assert!(
        watches_opened(&server, &grandchild_id, &caller, 2).await,
        "the second wait never opened its watch"
    );
    server
        .operator()
        .await
        .terminate_session(terminate(grandchild_id.as_str()))
        .await
        .expect("terminate");
    let out = finish_client(waiting).await;
    let results = &out[0]["results"];
    let got = ok(&results[0]);
    assert_eq!(got["session"]["session_id"], grandchild_id.as_str());
    assert_eq!(got["session"]["ended"], false, "{got}");
    assert!(got["children"].as_array().unwrap().is_empty());
    let short = ok(&results[1]);
    assert_eq!(short["timed_out"], true, "{short}");
    assert_eq!(short["session"]["ended"], false, "{short}");
    let long = ok(&results[2]);
    assert_eq!(long["timed_out"], false, "{long}");
    assert_eq!(long["session"]["status"], "terminated");
    assert_eq!(long["session"]["ended"], true);
    assert!(long["waited_s"].as_f64().unwrap() < 30.0, "{long}");
    let again = ok(&results[3]);
    assert_eq!(again["session"]["status"], "terminated");
    assert_eq!(again["terminated_session_ids"], json!([]));

    let ended = ok(&out[1]["results"][0]);
    assert_eq!(ended["terminated_session_ids"], json!([child_id]));
    let child = ok(&out[1]["results"][1]);
    assert_eq!(child["session"]["status"], "terminated");
    assert_eq!(child["children"][0]["session_id"], grandchild_id.as_str());
}

#[tokio::test]
async fn wait_for_session_outlasts_a_service_restart() {
    let mut server = TestServer::start().await;
    let endpoint = unix_endpoint(&server);
    let (root, _, root_token) = server.root("ws", TrustLevel::Direct).await;
    let mut root_client = server.client(Some(&root_token)).await;
    let child = troupe_tests::create_child(&mut root_client, troupe_tests::child("kid")).await;
    let waiting = spawn_client(vec![stdio(
        &endpoint,
        &root_token,
        vec![call(
            "wait_for_session",
            json!({"session_id": child.session_id, "timeout_s": 30}),
        )],
    )])
    .await;
    let caller = format!("session:{}", root.session_id);
    assert!(
        watches_opened(&server, &child.session_id, &caller, 1).await,
        "the wait never opened its watch"
    );
    server.restart().await;
    server
        .operator()
        .await
        .terminate_session(terminate(child.session_id.as_str()))
        .await
        .expect("terminate after the restart");
    let out = finish_client(waiting).await;
    let waited = ok(&out[0]["results"][0]);
    assert_eq!(waited["timed_out"], false, "{waited}");
    assert_eq!(waited["session"]["status"], "terminated");
}

#[tokio::test]
async fn http_endpoint_acts_as_each_requests_token() {
    let server = TestServer::start().await;
    let (alpha, _, alpha_token) = server.root("alpha", TrustLevel::Direct).await;
    let (beta, _, beta_token) = server.root("beta", TrustLevel::Sandboxed).await;
    let (a, b) = (alpha.session_id.as_str(), beta.session_id.as_str());
    let bridge = HttpBridge::start(&format!("http://{}", server.addr)).await;
    let url = bridge.url.as_str();
    let create = |title: &str| {
        call(
            "create_session",
            json!({"title": title, "agent_name": "worker", "initial_message": "go"}),
        )
    };
    let list = || call("list_workspace_sessions", json!({}));
    let mut hinted_a = bearer(&alpha_token);
    hinted_a["X-Agent-Session-Id"] = json!(a);
    let mut mismatched = bearer(&alpha_token);
    mismatched["X-Agent-Session-Id"] = json!(b);

    let out = drive(vec![
        http(url, bearer(&alpha_token), vec![create("a1"), list()]),
        http(
            url,
            bearer(&beta_token),
            vec![
                create("b1"),
                list(),
                call("get_session", json!({"session_id": a})),
            ],
        ),
        http(url, hinted_a, vec![list()]),
        http(url, mismatched, vec![create("not forwarded"), list()]),
        http(url, json!({}), vec![list()]),
        http(url, bearer("not-a-token"), vec![list()]),
    ])
    .await;

    // Each token acts as its own session, in its own workspace.
    let a1 = ok(&out[0]["results"][0]);
    assert_eq!(a1["session"]["parent_session_id"], a);
    assert_eq!(a1["session"]["workspace_id"], "alpha");
    let a1_id = a1["session"]["session_id"].as_str().unwrap();
    assert_eq!(ids(ok(&out[0]["results"][1])), sorted(&[a, a1_id]));
    let b1 = ok(&out[1]["results"][0]);
    assert_eq!(b1["session"]["parent_session_id"], b);
    assert_eq!(b1["session"]["workspace_id"], "beta");
    assert_eq!(b1["session"]["trust_level"], "sandboxed");
    let b1_id = b1["session"]["session_id"].as_str().unwrap();
    assert_eq!(ids(ok(&out[1]["results"][1])), sorted(&[b, b1_id]));
    refused(&out[1]["results"][2], "SESSION_NOT_FOUND");

    // A matching hint is accepted; a mismatched one refuses before forwarding.
    assert_eq!(ids(ok(&out[2]["results"][0])), sorted(&[a, a1_id]));
    for result in out[3]["results"].as_array().unwrap() {
        let text = refused(result, "SESSION_HINT_MISMATCH");
        assert!(text.starts_with("refused by the bridge: "), "{text}");
        assert!(text.contains("X-Agent-Session-Id"), "{text}");
        assert!(text.contains(b), "{text}");
    }
    let alpha_now = server
        .operator()
        .await
        .get_session(get(a))
        .await
        .expect("get")
        .into_inner();
    assert_eq!(
        alpha_now.children.len(),
        1,
        "the refused create was not forwarded"
    );

    // No token, or a bad one: clear refusals.
    let missing = refused(&out[4]["results"][0], "TOKEN_MISSING");
    assert!(missing.contains("Authorization: Bearer"), "{missing}");
    let invalid = refused(&out[5]["results"][0], "TOKEN_INVALID");
    assert!(
        invalid.starts_with("refused by the session service: "),
        "{invalid}"
    );
    assert_eq!(
        out[5]["results"][0]["structuredContent"]["error"]["code"],
        "UNAUTHENTICATED"
    );
    bridge.stop().await;
}

#[test]
fn stdio_without_its_environment_says_what_is_missing() {
    let run = |env: &[(&str, &str)]| {
        let output = std::process::Command::new(BRIDGE)
            .env_clear()
            .envs(env.iter().copied())
            .envs(passed_on())
            .stdin(Stdio::null())
            .output()
            .expect("bridge runs");
        assert!(!output.status.success());
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let no_token = run(&[]);
    assert!(
        no_token.contains("TROUPE_SESSION_TOKEN is not set"),
        "{no_token}"
    );
    let no_endpoint = run(&[("TROUPE_SESSION_TOKEN", "t")]);
    assert!(
        no_endpoint.contains("TROUPE_SESSION_ENDPOINT is not set"),
        "{no_endpoint}"
    );
    assert!(no_endpoint.contains("unix://"), "{no_endpoint}");
}
