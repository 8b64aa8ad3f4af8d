//! Broadcasts and groups through the real bridge, driven by the official
//! MCP Python SDK: a direct parent and a sandboxed child each broadcast and
//! post to one group, and each message reaches exactly the sessions its
//! sender may message, once (a group post only those that may message the
//! poster back); the sandboxed member never learns of the direct ones.

use crate::common;

use std::collections::BTreeMap;

use common::*;
use serde_json::{Value, json};
use troupe_proto::session::{CreateSessionRequest, TrustLevel};
use troupe_tests::TestServer;

/// The recipients an answer lists as delivered, by name, sorted.
fn delivered(answer: &Value, names: &BTreeMap<String, &'static str>) -> Vec<&'static str> {
    let mut got: Vec<&str> = answer["recipients"]
        .as_array()
        .expect("recipients")
        .iter()
        .filter(|r| r["outcome"] == "delivered")
        .map(|r| names[r["session_id"].as_str().expect("id")])
        .collect();
    got.sort_unstable();
    got
}

#[tokio::test]
async fn broadcasts_and_group_posts_reach_exactly_whom_the_sender_may_message() {
    let server = TestServer::start().await;
    let endpoint = unix_endpoint(&server);
    let (root, mut as_root, root_token) = server.root("ws", TrustLevel::Direct).await;
    let (outsider, _, _) = server.root("other", TrustLevel::Sandboxed).await;
    let mut ids = BTreeMap::from([("root", root.session_id.clone())]);
    ids.insert("outsider", outsider.session_id);
    for (name, trust) in [
        ("sandboxed", TrustLevel::Sandboxed),
        ("direct", TrustLevel::Direct),
        ("sandboxed2", TrustLevel::Sandboxed),
    ] {
        let child = as_root
            .create_session(CreateSessionRequest {
                title: name.into(),
                agent_name: "worker".into(),
                initial_message: "work".into(),
                trust_level: trust as i32,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .session
            .unwrap();
        ids.insert(name, child.session_id);
    }
    let names: BTreeMap<String, &'static str> = ids.iter().map(|(k, v)| (v.clone(), *k)).collect();
    let mut before = BTreeMap::new();
    for (name, id) in &ids {
        before.insert(*name, inbox_count(&server, id).await);
    }

    // The direct parent: a broadcast to its children, a group, a post.
    let members = json!([ids["sandboxed"], ids["direct"], ids["sandboxed2"]]);
    let out = drive(vec![stdio(
        &endpoint,
        &root_token,
        vec![
            call(
                "broadcast",
                json!({"message": "all hands", "scope": "children"}),
            ),
            call("create_group", json!({"name": "team"})),
            call(
                "add_to_group",
                json!({"group": "team", "session_ids": members}),
            ),
            call(
                "post_to_group",
                json!({"group": "team", "message": "team news"}),
            ),
        ],
    )])
    .await;
    let calls = &out[0]["results"];
    let everyone = ["direct", "sandboxed", "sandboxed2"];
    assert_eq!(delivered(ok(&calls[0]), &names), everyone, "{}", calls[0]);
    assert_eq!(
        ok(&calls[2])["member_ids"].as_array().map(Vec::len),
        Some(4)
    );
    // Its group post reaches the direct member only: a sandboxed member
    // never hears a poster it may not message.
    assert_eq!(delivered(ok(&calls[3]), &names), ["direct"], "{}", calls[3]);

    // The sandboxed child: its broadcast and post reach sandboxed2 only
    // (neither its direct parent nor the direct member), and its view of
    // the group names no direct session.
    let token = server.token_for(&ids["sandboxed"]).await;
    let out = drive(vec![stdio(
        &endpoint,
        &token,
        vec![
            call("broadcast", json!({"message": "from below"})),
            call(
                "post_to_group",
                json!({"group": "team", "message": "me too"}),
            ),
            call("list_groups", json!({})),
            call(
                "add_to_group",
                json!({"group": "team", "session_ids": [ids["root"]]}),
            ),
        ],
    )])
    .await;
    let calls = &out[0]["results"];
    assert_eq!(
        delivered(ok(&calls[0]), &names),
        ["sandboxed2"],
        "{}",
        calls[0]
    );
    assert_eq!(
        delivered(ok(&calls[1]), &names),
        ["sandboxed2"],
        "{}",
        calls[1]
    );
    let listed = ok(&calls[2]);
    assert_eq!(listed["count"], 1, "{listed}");
    let mut seen: Vec<&str> = listed["groups"][0]["member_ids"]
        .as_array()
        .expect("members")
        .iter()
        .map(|id| names[id.as_str().expect("id")])
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, ["sandboxed", "sandboxed2"], "{listed}");
    refused(&calls[3], "SESSION_NOT_FOUND");
    // (The refusal repeats only the id the child gave.)
    for answer in &calls.as_array().expect("results")[..3] {
        for direct in [&ids["root"], &ids["direct"]] {
            assert!(!answer.to_string().contains(direct.as_str()), "{answer}");
        }
    }

    // Each message once, in exactly the inboxes it was for.
    let expected = BTreeMap::from([
        ("root", 0),
        ("outsider", 0),
        ("direct", 2),
        ("sandboxed", 1),
        ("sandboxed2", 3),
    ]);
    for (name, id) in &ids {
        let grown = inbox_count(&server, id).await - before[name];
        assert_eq!(grown, expected[name], "{name}'s inbox");
    }
}
