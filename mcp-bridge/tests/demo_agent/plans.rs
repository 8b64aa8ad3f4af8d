//! A root's plan (spawns, a refusal, lists, messages, a wait, its exit
//! code) and a child's (refused at the depth limit, a reply to its parent).

use super::*;

#[tokio::test]
async fn root_plan_spawns_refuses_lists_sends_waits_and_exits_with_its_code() {
    let server = TestServer::start().await;
    let (root, _, _) = server.root("ws", TrustLevel::Direct).await;
    let root_id = root.session_id.as_str();
    let child_plan = json!({"say": "hi", "exit": 0});
    let plan = json!({
        "say": "assembling the team",
        "spawn": [
            {"agent": "worker", "title": "backend", "message": child_plan},
            {"agent": "nobody", "message": "never"},
            {"agent": "worker", "title": "docs", "message": "write docs"},
        ],
        "list": true,
        "send": [{"to": "children", "message": "status?"}],
        "wait_messages": 1,
        "collect": true,
        "collect_timeout_s": 0.5,
        "reply": "all done",
        "exit": 3,
    });
    let mut agent = Agent::start(Some(&server), Some((root_id, None))).await;
    agent.write("operator", &plan.to_string()).await;
    agent.until("sent", 2).await;
    agent.write("operator", "keep going").await;
    let run = agent.finish(false).await;

    assert_eq!(run.code, Some(3), "{:#?}", run.events);
    assert_eq!(
        run.names(),
        [
            "say", "spawned", "refused", "spawned", "listed", "sent", "sent", "message", "timeout",
            "error", "done"
        ],
        "{:#?}",
        run.events
    );
    assert_eq!(text_of(run.one("say")), "assembling the team");
    let spawned = run.all("spawned");
    let children: Vec<String> = spawned.iter().map(|e| id_of(e)).collect();
    for (event, title) in spawned.iter().zip(["backend", "docs"]) {
        assert_eq!(event["agent"], "worker");
        assert_eq!(event["title"], title);
        assert_eq!(event["depth"], 1);
        assert_eq!(event["mode"], "callback");
    }
    let refused = run.one("refused");
    assert_eq!(refused["reason"], "AGENT_NOT_FOUND", "{refused}");
    assert_eq!(refused["agent"], "nobody");
    assert!(text_of(refused).contains("AGENT_NOT_FOUND"), "{refused}");

    let mut listed: Vec<&str> = run.one("listed")["session_ids"]
        .as_array()
        .expect("session_ids")
        .iter()
        .map(|v| v.as_str().expect("id"))
        .collect();
    listed.sort_unstable();
    let mut expected = vec![root_id, &children[0], &children[1]];
    expected.sort_unstable();
    assert_eq!(listed, expected);

    for (sent, child_id) in run.all("sent").iter().zip(&children) {
        assert_eq!(sent["to"], child_id.as_str());
        assert_eq!(sent["delivery"], "queued", "no runner, so queued: {sent}");
    }
    let message = run.one("message");
    assert_eq!(message["from"], "operator");
    assert_eq!(message["message"], "keep going");
    assert_eq!(run.one("timeout")["pending"], json!(children));
    assert!(
        text_of(run.one("error")).contains("no parent"),
        "a root's reply is skipped: {:#?}",
        run.events
    );
    assert_eq!(run.one("done")["exit_code"], 3);

    // Each child holds its first message (the plan as JSON text) and "status?".
    for child_id in &children {
        assert_eq!(inbox_count(&server, child_id).await, 2);
    }
    server.stop().await;
}

#[tokio::test]
async fn child_plan_is_refused_at_the_depth_limit_and_replies_to_its_parent() {
    let server = TestServer::start_with(|config| config.limits.max_depth = 1).await;
    let (root, mut root_client, _) = server.root("ws", TrustLevel::Direct).await;
    let sub = create_child(&mut root_client, child("sub")).await;
    let before = inbox_count(&server, &root.session_id).await;
    let plan = json!({
        "spawn": [{"agent": "worker", "title": "too deep"}],
        "send": [{"to": "parent", "message": "starting"}],
        "collect": true,
        "reply": "finished",
    });
    let mut agent = Agent::start(
        Some(&server),
        Some((&sub.session_id, Some(&root.session_id))),
    )
    .await;
    agent.write("operator", &plan.to_string()).await;
    let run = agent.finish(false).await;

    assert_eq!(run.code, Some(0), "{:#?}", run.events);
    assert_eq!(run.names(), ["refused", "sent", "sent", "done"]);
    let refused = run.one("refused");
    assert_eq!(refused["reason"], "DEPTH_EXCEEDED", "{refused}");
    assert!(text_of(refused).contains("depth_remaining=0"), "{refused}");
    for sent in run.all("sent") {
        assert_eq!(sent["to"], root.session_id.as_str());
        assert_eq!(sent["delivery"], "queued", "{sent}");
    }
    assert_eq!(inbox_count(&server, &root.session_id).await, before + 2);
    server.stop().await;
}
