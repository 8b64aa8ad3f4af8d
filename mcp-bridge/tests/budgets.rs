//! `create_session`'s budget through `troupe-mcp`, driven by the MCP
//! Python SDK against a real session service: a child created with a budget
//! has it; a budget wider than what the parent has left is refused by the
//! session service, its refusal surfaced; an amount that is not one is
//! refused by the bridge, naming the argument, and nothing is created.

use crate::common;

use common::*;
use serde_json::json;
use troupe_proto::session::{self as pb, TrustLevel};
use troupe_tests::TestServer;

#[tokio::test]
async fn a_child_gets_the_budget_asked_and_never_more_than_its_parent_has_left() {
    let server = TestServer::start().await;
    let root = server
        .operator()
        .await
        .create_root_session(pb::CreateRootSessionRequest {
            workspace_id: "ws".to_owned(),
            trust_level: TrustLevel::Direct as i32,
            agent_name: "worker".to_owned(),
            budget: Some(pb::Budget {
                cost_pico_usd: Some(1_000_000_000_000),
                tokens: Some(10_000),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("root")
        .into_inner();
    let root_id = root.session.expect("session").session_id;
    let create = |budget: serde_json::Value| {
        let mut arguments = json!({"title": "t", "agent_name": "worker", "initial_message": "go"});
        arguments
            .as_object_mut()
            .unwrap()
            .extend(budget.as_object().unwrap().clone());
        call("create_session", arguments)
    };
    let out = drive(vec![stdio(
        &unix_endpoint(&server),
        &root.session_token,
        vec![
            create(json!({"budget_usd": "0.25", "budget_tokens": 500,
                          "budget_calls": 3, "budget_wall_secs": 60})),
            create(json!({"budget_usd": 1.5})),
            create(json!({"budget_tokens": 10_001})),
            create(json!({"budget_usd": "1.5e3"})),
            create(json!({"budget_calls": -1})),
        ],
    )])
    .await;
    let results = &out[0]["results"];

    let created = ok(&results[0]);
    assert_eq!(
        created["session"]["budget"]["cost_usd"], "0.25",
        "{created}"
    );
    let child = created["session"]["session_id"].as_str().expect("id");
    let shown = server.get(child).await.session.expect("session");
    assert_eq!(
        shown.budget,
        Some(pb::Budget {
            cost_pico_usd: Some(250_000_000_000),
            tokens: Some(500),
            model_calls: Some(3),
            wall_ms: Some(60_000),
        })
    );
    assert!(shown.deadline.is_some(), "{shown:?}");

    // Wider than the parent's remainder: the session service refuses, and
    // the agent reads its reason, what is left and what to do.
    let text = refused(&results[1], "BUDGET_EXCEEDED");
    let error = &results[1]["structuredContent"]["error"];
    assert_eq!(error["source"], "session-service", "{error}");
    assert_eq!(
        error["metadata"]["cost_pico_usd_remaining"], 1_000_000_000_000u64,
        "{error}"
    );
    assert!(
        text.contains("cost_pico_usd_remaining=1000000000000"),
        "{text}"
    );
    let error = &results[2]["structuredContent"]["error"];
    refused(&results[2], "BUDGET_EXCEEDED");
    assert_eq!(error["metadata"]["tokens_remaining"], 10_000, "{error}");
    assert_eq!(error["metadata"]["budget_dimension"], "tokens", "{error}");

    for (i, field) in [(3, "budget_usd"), (4, "budget_calls")] {
        let text = refused(&results[i], "INVALID_ARGUMENT");
        let error = &results[i]["structuredContent"]["error"];
        assert_eq!(error["source"], "bridge", "{error}");
        assert_eq!(error["metadata"]["field"], field, "{error}");
        assert!(text.contains(field), "{text}");
    }
    let children = server.get(&root_id).await.children;
    assert_eq!(
        children.len(),
        1,
        "only the first was created: {children:?}"
    );
}
