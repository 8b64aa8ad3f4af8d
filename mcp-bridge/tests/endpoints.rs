//! `troupe-mcp` given several session-service endpoints (replicas of one
//! service), driven by the official MCP Python SDK: a tool's call goes on
//! from an endpoint it cannot reach to the next, any answer is final, and
//! creates and sends carry request ids of their own.

use crate::common;

use common::*;
use serde_json::json;
use sqlx::{Connection, sqlite::SqliteConnection};
use troupe_proto::session::TrustLevel;
use troupe_tests::TestServer;

/// Counts the request ids a server's SQLite database recorded (the server stopped).
async fn request_ids(server: &TestServer) -> i64 {
    let mut db = SqliteConnection::connect(&server.config.database_url())
        .await
        .expect("open the database");
    let (count,): (i64,) = sqlx::query_as("SELECT count(*) FROM idempotency")
        .fetch_one(&mut db)
        .await
        .expect("count");
    count
}

/// With a dead endpoint first (a socket nobody serves), every tool is
/// answered by the live one; the create and the send each carry a request
/// id, so that a repeat on another replica would be a replay.
#[tokio::test]
async fn tools_go_on_from_a_dead_endpoint_to_a_live_one() {
    let mut server = TestServer::start().await;
    let (root, _, token) = server.root("ws", TrustLevel::Direct).await;
    let dead = tempfile_path(&server);
    let endpoints = format!("unix://{dead},{}", unix_endpoint(&server));
    let out = drive(vec![stdio(
        &endpoints,
        &token,
        vec![
            call(
                "create_session",
                json!({"title": "helper", "agent_name": "worker", "initial_message": "go"}),
            ),
            call("list_workspace_sessions", json!({})),
            call("get_session", json!({"session_id": root.session_id})),
        ],
    )])
    .await;
    let results = &out[0]["results"];
    let kid = ok(&results[0])["session"]["session_id"]
        .as_str()
        .expect("the child's id")
        .to_owned();
    assert_eq!(ids(ok(&results[1])), sorted(&[&root.session_id, &kid]));
    assert_eq!(
        ok(&results[2])["session"]["session_id"],
        root.session_id.as_str()
    );

    let out = drive(vec![stdio(
        &endpoints,
        &token,
        vec![call(
            "send_message",
            json!({"session_id": kid, "message": "hi"}),
        )],
    )])
    .await;
    ok(&out[0]["results"][0]);
    assert_eq!(
        inbox_count(&server, &kid).await,
        2,
        "the initial message and one send"
    );

    server.stop_for_restart().await;
    assert_eq!(request_ids(&server).await, 2, "the create's and the send's");
}

/// A refusal is an answer: the first endpoint's server does not know the
/// token, and the call is not tried on the second, which would.
#[tokio::test]
async fn a_refusal_is_final_and_not_tried_elsewhere() {
    let first = TestServer::start().await;
    let second = TestServer::start().await;
    let (_, _, token) = second.root("ws", TrustLevel::Direct).await;
    let endpoints = format!("{},{}", unix_endpoint(&first), unix_endpoint(&second));
    let out = drive(vec![stdio(
        &endpoints,
        &token,
        vec![call("list_workspace_sessions", json!({}))],
    )])
    .await;
    refused(&out[0]["results"][0], "TOKEN_INVALID");
}

/// A socket path in the server's data directory that nothing serves.
fn tempfile_path(server: &TestServer) -> String {
    server
        .config
        .data_dir
        .join("nobody.sock")
        .display()
        .to_string()
}
