//! Every refusal of the spawn tree's rules an agent can meet through
//! `create_session`, `terminate_session` and `wait_for_session`, through the
//! real bridge driven by the MCP Python SDK against a real session service:
//! each arrives as a tool error naming its reason, with advice the agent can
//! act on, and nothing was created or ended. The limits are a table, run
//! through one helper, each case on a server of its own.

use crate::common;

use common::*;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use troupe_proto::session::TrustLevel;
use troupe_tests::TestServer;

/// The limit a case's server is given.
enum Limit {
    None,
    TreeSessions(u32),
    Children(u32),
    ActivePerWorkspace(u32),
    /// One spawn, then one in a thousand seconds.
    SpawnRate,
}

/// A create refused after `before` creates that succeed.
struct Case {
    reason: &'static str,
    limit: Limit,
    /// The root's trust level.
    trust: TrustLevel,
    before: usize,
    /// The refused create's arguments besides its title.
    arguments: fn() -> Value,
    /// Words of the advice (none: the call has no advice).
    advice: Option<&'static str>,
    /// Who refused it.
    source: &'static str,
    /// The argument at fault, for an INVALID_ARGUMENT.
    field: Option<&'static str>,
}

const CASES: &[Case] = &[
    Case {
        reason: "TREE_QUOTA_EXCEEDED",
        limit: Limit::TreeSessions(2),
        trust: TrustLevel::Direct,
        before: 1,
        arguments: || json!({}),
        advice: Some("reuse existing sessions with send_message"),
        source: "session-service",
        field: None,
    },
    Case {
        reason: "CHILD_QUOTA_EXCEEDED",
        limit: Limit::Children(1),
        trust: TrustLevel::Direct,
        before: 1,
        arguments: || json!({}),
        advice: Some("reuse existing children"),
        source: "session-service",
        field: None,
    },
    Case {
        reason: "WORKSPACE_QUOTA_EXCEEDED",
        limit: Limit::ActivePerWorkspace(2),
        trust: TrustLevel::Direct,
        before: 1,
        arguments: || json!({}),
        advice: Some("wait for some to end (wait_for_session)"),
        source: "session-service",
        field: None,
    },
    Case {
        reason: "RATE_LIMITED",
        limit: Limit::SpawnRate,
        trust: TrustLevel::Direct,
        before: 1,
        arguments: || json!({}),
        advice: Some("too fast: retry in "),
        source: "session-service",
        field: None,
    },
    Case {
        reason: "TRUST_ESCALATION",
        limit: Limit::None,
        trust: TrustLevel::Sandboxed,
        before: 0,
        arguments: || json!({"trust_level": "direct"}),
        advice: Some("omit trust_level"),
        source: "session-service",
        field: None,
    },
    Case {
        reason: "AGENT_NOT_FOUND",
        limit: Limit::None,
        trust: TrustLevel::Direct,
        before: 0,
        arguments: || json!({"agent_name": "nobody"}),
        advice: Some("the operator defines agents"),
        source: "session-service",
        field: None,
    },
    Case {
        reason: "AGENT_INVALID",
        limit: Limit::None,
        trust: TrustLevel::Direct,
        before: 0,
        arguments: || json!({"agent_name": "broken"}),
        advice: Some("malformed"),
        source: "session-service",
        field: None,
    },
    Case {
        reason: "INVALID_ARGUMENT",
        limit: Limit::None,
        trust: TrustLevel::Direct,
        before: 0,
        arguments: || json!({"trust_level": "superuser"}),
        advice: None,
        source: "bridge",
        field: Some("trust_level"),
    },
    // Nothing would run the child: there is no runner here.
    Case {
        reason: "INVALID_ARGUMENT",
        limit: Limit::None,
        trust: TrustLevel::Direct,
        before: 0,
        arguments: || json!({"mode": "sync"}),
        advice: None,
        source: "session-service",
        field: Some("mode"),
    },
];

/// Runs `case`: the root creates `before` children, then the refused one.
async fn check(case: &'static Case) {
    let server = TestServer::start_with(|c| match case.limit {
        Limit::None => {}
        Limit::TreeSessions(n) => c.limits.max_tree_sessions = n,
        Limit::Children(n) => c.limits.max_children = n,
        Limit::ActivePerWorkspace(n) => c.limits.max_active_per_workspace = n,
        Limit::SpawnRate => {
            c.limits.spawn_rate_per_sec = 0.001;
            c.limits.spawn_burst = 1;
        }
    })
    .await;
    server.write_agent_text(None, "broken", "no front matter here\n");
    let (root, _, token) = server.root("ws", case.trust).await;
    let mut calls: Vec<Value> = (0..case.before)
        .map(|i| create(&format!("child {i}"), json!({})))
        .collect();
    calls.push(create("refused", (case.arguments)()));
    let out = drive(vec![stdio(&unix_endpoint(&server), &token, calls)]).await;
    let results = out[0]["results"].as_array().expect("results");
    for result in &results[..case.before] {
        ok(result);
    }
    let last = &results[case.before];
    let text = refused(last, case.reason);
    let error = &last["structuredContent"]["error"];
    assert_eq!(error["source"], case.source, "{}: {error}", case.reason);
    match case.advice {
        Some(words) => {
            let advice = advice(last);
            assert!(advice.contains(words), "{}: {advice}", case.reason);
        }
        None => assert_eq!(error["advice"], Value::Null, "{}: {error}", case.reason),
    }
    if let Some(field) = case.field {
        assert_eq!(error["metadata"]["field"], field, "{error}");
        assert!(text.contains(field), "{text}");
    }
    let children = server.get(&root.session_id).await.children;
    assert_eq!(children.len(), case.before, "{}: nothing more", case.reason);
}

#[tokio::test(flavor = "multi_thread")]
async fn each_refused_create_says_which_rule_and_what_to_do_and_creates_nothing() {
    let mut cases = JoinSet::new();
    for case in CASES {
        cases.spawn(check(case));
    }
    while let Some(done) = cases.join_next().await {
        if let Err(failed) = done {
            std::panic::resume_unwind(failed.into_panic());
        }
    }
}

#[tokio::test]
async fn terminating_or_waiting_outside_ones_subtree_is_refused_and_ends_nothing() {
    let server = TestServer::start().await;
    let (root, mut as_root, _) = server.root("ws", TrustLevel::Direct).await;
    let (other, _, _) = server.root("ws", TrustLevel::Direct).await;
    let child = troupe_tests::create_child(&mut as_root, troupe_tests::child("kid")).await;
    let token = server.token_for(&child.session_id).await;
    let unknown = "sess_00000000000000000000000000";
    let out = drive(vec![stdio(
        &unix_endpoint(&server),
        &token,
        vec![
            call("terminate_session", json!({"session_id": root.session_id})),
            call("terminate_session", json!({"session_id": other.session_id})),
            call("terminate_session", json!({"session_id": unknown})),
            call(
                "wait_for_session",
                json!({"session_id": unknown, "timeout_s": 5}),
            ),
        ],
    )])
    .await;
    let results = &out[0]["results"];
    for (i, reason, words) in [
        (0, "NOT_A_DESCENDANT", "only sessions below it"),
        (1, "NOT_A_DESCENDANT", "only sessions below it"),
        (2, "SESSION_NOT_FOUND", "list_workspace_sessions shows"),
        (3, "SESSION_NOT_FOUND", "list_workspace_sessions shows"),
    ] {
        refused(&results[i], reason);
        let advice = advice(&results[i]);
        assert!(advice.contains(words), "{i}: {advice}");
    }
    for id in [&root.session_id, &other.session_id, &child.session_id] {
        let session = server.get(id).await.session.expect("session");
        assert_eq!(
            session.status(),
            troupe_proto::session::SessionStatus::Pending,
            "{id} goes on"
        );
    }
}
