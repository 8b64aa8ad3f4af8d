//! Broadcast and groups with real agents in the container: scripted demo
//! agents call `troupe-mcp` there, over the session service's Unix socket,
//! and listeners print every message their stdin brings. Each message
//! reaches exactly the sessions its sender may message, once; a group post
//! only the members that may message the poster back.

use crate::common;

use common::pair::*;
use serde_json::{Value, json};
use troupe_proto::session::{self as pb, SessionStatus, TrustLevel};

/// A root session of `trust` running the demo agent with `plan`.
async fn demo(pair: &Pair, ws: &str, title: &str, trust: TrustLevel, plan: Value) -> String {
    pair.server
        .operator()
        .await
        .create_root_session(pb::CreateRootSessionRequest {
            workspace_id: ws.into(),
            trust_level: trust as i32,
            title: title.into(),
            agent_name: "demo".into(),
            initial_message: plan.to_string(),
            ..Default::default()
        })
        .await
        .expect("create root")
        .into_inner()
        .session
        .expect("session")
        .session_id
}

/// The texts of the messages an agent printed, and their senders as it saw them.
fn received(events: &[Value]) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| e["event"] == "message")
        .map(|e| {
            (
                e["message"].as_str().unwrap_or_default().to_owned(),
                e["from"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn broadcasts_and_posts_reach_exactly_the_allowed_agents_once() {
    require_agent_tools();
    let pair = Pair::start().await;
    let ws = pair.runner.workspace("crowd");
    pair.agent_command(&ws, "demo", &["troupe-demo-agent"]);
    // Listeners: a direct one hears two messages, a sandboxed one four.
    let direct = demo(
        &pair,
        &ws,
        "direct listener",
        TrustLevel::Direct,
        json!({"wait_messages": 2}),
    )
    .await;
    let sandboxed = demo(
        &pair,
        &ws,
        "sandboxed listener",
        TrustLevel::Sandboxed,
        json!({"wait_messages": 3}),
    )
    .await;
    // A sandboxed sender: once it heard the direct sender's broadcast (its
    // group post is not for a sandboxed member), it broadcasts and posts in
    // turn.
    let low = demo(
        &pair,
        &ws,
        "sandboxed sender",
        TrustLevel::Sandboxed,
        json!({
            "wait_messages": 1,
            "calls": [
                {"tool": "broadcast", "arguments": {"message": "low broadcast"}},
                {"tool": "post_to_group", "arguments": {"group": "crew", "message": "low post"}},
                {"tool": "list_groups"},
            ],
        }),
    )
    .await;
    for id in [&direct, &sandboxed, &low] {
        pair.wait_status(id, SessionStatus::Running).await;
    }
    // The direct sender makes the group, posts to it, then broadcasts.
    let high = demo(
        &pair,
        &ws,
        "direct sender",
        TrustLevel::Direct,
        json!({
            "calls": [
                {"tool": "create_group", "arguments": {"name": "crew"}},
                {"tool": "add_to_group", "arguments": {"group": "crew", "session_ids": [direct, sandboxed, low]}},
                {"tool": "post_to_group", "arguments": {"group": "crew", "message": "high post"}},
                {"tool": "broadcast", "arguments": {"message": "high broadcast"}},
            ],
        }),
    )
    .await;

    let mut out = std::collections::BTreeMap::new();
    for (name, id) in [
        ("high", &high),
        ("low", &low),
        ("direct", &direct),
        ("sandboxed", &sandboxed),
    ] {
        let done = pair.wait_status(id, SessionStatus::Completed).await;
        out.insert(name, events(&done.result.expect("result").output_tail));
    }
    let called = |name: &str, tool: &str| -> Value {
        out[name]
            .iter()
            .find(|e| e["event"] == "called" && e["tool"] == tool)
            .unwrap_or_else(|| panic!("{name} did not call {tool}: {:?}", out[name]))["result"]
            .clone()
    };
    let reached = |answer: &Value| -> Vec<String> {
        let mut ids: Vec<String> = answer["recipients"]
            .as_array()
            .expect("recipients")
            .iter()
            .filter(|r| r["outcome"] == "delivered")
            .map(|r| r["session_id"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        ids
    };
    let sorted = |mut ids: Vec<String>| {
        ids.sort();
        ids
    };
    let everyone_but_high = sorted(vec![direct.clone(), sandboxed.clone(), low.clone()]);
    // A group post reaches the members that may message the poster back.
    assert_eq!(reached(&called("high", "post_to_group")), [direct.as_str()]);
    assert_eq!(reached(&called("high", "broadcast")), everyone_but_high);
    // The sandboxed sender reaches the sandboxed listener only, and sees no
    // direct member of its group.
    assert_eq!(reached(&called("low", "broadcast")), [sandboxed.as_str()]);
    assert_eq!(
        reached(&called("low", "post_to_group")),
        [sandboxed.as_str()]
    );
    let groups = called("low", "list_groups");
    let seen = sorted(
        groups["groups"][0]["member_ids"]
            .as_array()
            .expect("members")
            .iter()
            .map(|id| id.as_str().unwrap().to_owned())
            .collect(),
    );
    assert_eq!(
        seen,
        sorted(vec![sandboxed.clone(), low.clone()]),
        "{groups}"
    );
    let low_text = serde_json::to_string(&out["low"]).unwrap();
    assert!(
        !low_text.contains(&high) && !low_text.contains(&direct),
        "{low_text}"
    );

    // What reached each agent's stdin: each message once, from whom it may see.
    let texts = |name: &str| {
        let mut got: Vec<String> = received(&out[name]).into_iter().map(|(t, _)| t).collect();
        got.sort();
        got
    };
    assert_eq!(texts("direct"), ["high broadcast", "high post"]);
    assert_eq!(texts("low"), ["high broadcast"]);
    assert_eq!(
        texts("sandboxed"),
        ["high broadcast", "low broadcast", "low post"]
    );
    for (text, from) in received(&out["sandboxed"]) {
        let expected = if text.starts_with("high") {
            "session".to_owned() // a direct sender is not named to a sandboxed agent
        } else {
            format!("session:{low}")
        };
        assert_eq!(from, expected, "{text}");
    }
    // And nothing more was stored: the plan message, then exactly those.
    for (id, messages) in [(&direct, 2), (&sandboxed, 3), (&low, 1), (&high, 0)] {
        assert_eq!(pair.get(id).await.inbox_count, 1 + messages, "{id}");
    }
}
