//! What the tools answer, and do, for the arguments the other tests leave
//! out, through the real bridge driven by the MCP Python SDK: a child's
//! failure as its parent reads it, a child told when its parent ends, a broadcast to a subtree, a list with ended sessions, and a list
//! longer than one page of the service's.

use crate::common;

use common::*;
use serde_json::json;
use troupe_proto::session::{self as pb, SessionStatus, TrustLevel};
use troupe_tests::{TestServer, child, create_child, terminate};

#[tokio::test]
async fn a_child_that_fails_hands_its_parent_the_failure() {
    let server = TestServer::start().await;
    let endpoint = unix_endpoint(&server);
    let (_, mut as_root, root_token) = server.root("ws", TrustLevel::Direct).await;
    let kid = create_child(&mut as_root, child("helper")).await.session_id;
    let kid_token = server.token_for(&kid).await;
    let out = drive(vec![stdio(
        &endpoint,
        &kid_token,
        vec![call(
            "finish",
            json!({"result": "the disk is full", "outcome": "failure"}),
        )],
    )])
    .await;
    let finished = ok(&out[0]["results"][0]);
    assert_eq!(finished["session"]["status"], "failed", "{finished}");

    let out = drive(vec![stdio(
        &endpoint,
        &root_token,
        vec![call("get_session", json!({"session_id": kid}))],
    )])
    .await;
    let got = ok(&out[0]["results"][0]);
    assert_eq!(got["result"]["status"], "failed", "{got}");
    assert_eq!(
        got["result"]["finished"],
        json!({"outcome": "failure", "result": "the disk is full"}),
        "{got}"
    );
}

#[tokio::test]
async fn a_child_created_to_be_notified_outlives_its_parent_and_is_told() {
    let server = TestServer::start().await;
    let (root, _, root_token) = server.root("ws", TrustLevel::Direct).await;
    let out = drive(vec![stdio(
        &unix_endpoint(&server),
        &root_token,
        vec![create("watcher", json!({"on_parent_end": "notify"}))],
    )])
    .await;
    let kid = created_id(&out[0]["results"][0]);
    server
        .operator()
        .await
        .terminate_session(terminate(root.session_id.as_str()))
        .await
        .expect("terminate the root");
    let view = server.get(&kid).await;
    assert_eq!(
        view.session.expect("session").status(),
        SessionStatus::Pending,
        "it keeps going"
    );
    assert_eq!(view.inbox_count, 2, "its task and the parent's end");
}

#[tokio::test]
async fn a_subtree_broadcast_reaches_the_descendants_only() {
    let server = TestServer::start().await;
    let (root, mut as_root, root_token) = server.root("ws", TrustLevel::Direct).await;
    let (other, _, _) = server.root("ws", TrustLevel::Direct).await;
    let kid = create_child(&mut as_root, child("kid")).await.session_id;
    let mut as_kid = server.act_as(&kid).await;
    let grandchild = create_child(&mut as_kid, child("grandchild"))
        .await
        .session_id;
    let out = drive(vec![stdio(
        &unix_endpoint(&server),
        &root_token,
        vec![call(
            "broadcast",
            json!({"message": "below only", "scope": "subtree"}),
        )],
    )])
    .await;
    let answer = ok(&out[0]["results"][0]);
    assert_eq!(answer["delivered"], 2, "{answer}");
    let mut reached: Vec<&str> = answer["recipients"]
        .as_array()
        .expect("recipients")
        .iter()
        .map(|r| r["session_id"].as_str().expect("id"))
        .collect();
    reached.sort_unstable();
    assert_eq!(
        reached,
        sorted(&[kid.as_str(), grandchild.as_str()]),
        "{answer}"
    );
    for (id, count) in [
        (&root.session_id, 1),
        (&other.session_id, 1),
        (&kid, 2),
        (&grandchild, 2),
    ] {
        assert_eq!(inbox_count(&server, id).await, count, "{id}");
    }
}

#[tokio::test]
async fn ended_sessions_are_listed_only_when_asked_for() {
    let server = TestServer::start().await;
    let (root, mut as_root, root_token) = server.root("ws", TrustLevel::Direct).await;
    let kid = create_child(&mut as_root, child("kid")).await.session_id;
    let out = drive(vec![stdio(
        &unix_endpoint(&server),
        &root_token,
        vec![
            call("terminate_session", json!({"session_id": kid})),
            call("list_workspace_sessions", json!({})),
            call("list_workspace_sessions", json!({"include_ended": true})),
        ],
    )])
    .await;
    let results = &out[0]["results"];
    assert_eq!(ok(&results[0])["terminated_session_ids"], json!([kid]));
    assert_eq!(ids(ok(&results[1])), sorted(&[root.session_id.as_str()]));
    let all = ok(&results[2]);
    assert_eq!(ids(all), sorted(&[root.session_id.as_str(), kid.as_str()]));
    let ended = all["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .find(|s| s["session_id"] == kid.as_str())
        .expect("the ended child");
    assert_eq!(ended["status"], "terminated", "{ended}");
    assert_eq!(ended["ended"], true, "{ended}");
}

/// More sessions than the service lists on one page (1000).
const PAST_ONE_PAGE: usize = 1001;

#[tokio::test]
async fn a_list_longer_than_a_page_is_read_whole() {
    let server =
        TestServer::start_with(|c| c.limits.max_active_per_workspace = PAST_ONE_PAGE as u32).await;
    let (root, _, token) = server.root("ws", TrustLevel::Direct).await;
    let mut operator = server.operator().await;
    let mut expected = vec![root.session_id.clone()];
    for i in 1..PAST_ONE_PAGE {
        let created = operator
            .create_root_session(pb::CreateRootSessionRequest {
                workspace_id: "ws".to_owned(),
                trust_level: TrustLevel::Direct as i32,
                title: format!("root {i}"),
                agent_name: "worker".to_owned(),
                ..Default::default()
            })
            .await
            .expect("create a root")
            .into_inner();
        expected.push(created.session.expect("session").session_id);
    }
    expected.sort();
    let out = drive(vec![stdio(
        &unix_endpoint(&server),
        &token,
        vec![call("list_workspace_sessions", json!({}))],
    )])
    .await;
    let listed = ok(&out[0]["results"][0]);
    assert_eq!(listed["count"], PAST_ONE_PAGE, "every session, once");
    assert_eq!(ids(listed), expected);
}
