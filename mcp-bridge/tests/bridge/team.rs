//! A team made through the tools over stdio: spawns, messages, lists and
//! the depth limit; and a wait that outlasts a restart of the service.

use super::*;

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
