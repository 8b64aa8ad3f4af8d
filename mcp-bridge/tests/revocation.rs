//! The bridge's long calls end when their caller's token lapses: a
//! `wait_for_session` made as a session that is then terminated returns,
//! refused (TOKEN_REVOKED), as soon as the service ends its watch, over
//! stdio as over the shared HTTP endpoint; a call with an expired token is
//! refused saying who can issue another. Driven by the real MCP client.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};
use troupe_proto::session::{ListWorkspaceSessionsRequest, TrustLevel};
use troupe_tests::{TestServer, terminate};

/// Long enough that a wait ending by its timeout fails the test's clock.
const WAIT_S: u64 = 40;

/// A session waits on a sibling through `connection`; it is terminated
/// while it waits. Returns the call's result and how long it took.
async fn terminated_while_waiting(
    server: &TestServer,
    connection: impl FnOnce(&str, &str) -> Value,
) -> (Value, Duration) {
    let (waiter, _, waiter_token) = server.root("ws", TrustLevel::Direct).await;
    let (sibling, _, _) = server.root("ws", TrustLevel::Direct).await;
    let started = Instant::now();
    let waiting = spawn_client(vec![connection(&waiter_token, &sibling.session_id)]).await;
    let caller = format!("session:{}", waiter.session_id);
    assert!(
        watches_opened(server, &sibling.session_id, &caller, 1).await,
        "the wait never opened its watch"
    );
    server
        .operator()
        .await
        .terminate_session(terminate(waiter.session_id.as_str()))
        .await
        .expect("terminate the waiting session");
    let out = finish_client(waiting).await;
    (out[0]["results"][0].clone(), started.elapsed())
}

fn wait_call(sibling: &str) -> Vec<Value> {
    vec![call(
        "wait_for_session",
        json!({"session_id": sibling, "timeout_s": WAIT_S}),
    )]
}

#[tokio::test]
async fn a_wait_over_stdio_ends_refused_when_its_session_is_terminated() {
    let server = TestServer::start().await;
    let endpoint = unix_endpoint(&server);
    let (result, took) = terminated_while_waiting(&server, |token, sibling| {
        stdio(&endpoint, token, wait_call(sibling))
    })
    .await;
    refused(&result, "TOKEN_REVOKED");
    assert!(took < Duration::from_secs(WAIT_S / 2), "took {took:?}");
}

#[tokio::test]
async fn a_wait_over_http_ends_refused_when_its_session_is_terminated() {
    let server = TestServer::start().await;
    let bridge = HttpBridge::start(&format!("http://{}", server.addr)).await;
    let (result, took) = terminated_while_waiting(&server, |token, sibling| {
        http(&bridge.url, bearer(token), wait_call(sibling))
    })
    .await;
    refused(&result, "TOKEN_REVOKED");
    assert!(took < Duration::from_secs(WAIT_S / 2), "took {took:?}");
    bridge.stop().await;
}

#[tokio::test]
async fn a_call_with_an_expired_token_is_refused_saying_who_issues_another() {
    let server = TestServer::start_with(|c| c.token_ttl_secs = 1).await;
    let (_, mut client, token) = server.root("ws", TrustLevel::Direct).await;
    // The token lapses a second after it was issued.
    let deadline = Instant::now() + Duration::from_secs(30);
    while client
        .list_workspace_sessions(ListWorkspaceSessionsRequest::default())
        .await
        .is_ok()
    {
        assert!(Instant::now() < deadline, "the token never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let out = drive(vec![stdio(
        &unix_endpoint(&server),
        &token,
        vec![call("list_workspace_sessions", json!({}))],
    )])
    .await;
    let result = &out[0]["results"][0];
    refused(result, "TOKEN_EXPIRED");
    let advice = advice(result);
    assert!(
        advice.contains("the operator can issue a new one"),
        "{advice}"
    );
}
