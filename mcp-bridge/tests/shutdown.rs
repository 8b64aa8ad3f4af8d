//! A stop (SIGTERM) of `troupe-mcp`, as an operator or the runner sends it,
//! while an agent's call is open: the HTTP bridge exits within its drain
//! time even with a client stalled halfway through sending a request, and a
//! stdio bridge exits at once, its client still attached. Both exit cleanly.

use crate::common;

use std::{
    process::Stdio,
    time::{Duration, Instant},
};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use common::*;
use serde_json::{Value, json};
use troupe_proto::session::TrustLevel;
use troupe_tests::TestServer;

const DRAIN_MS: u64 = 1000;

#[tokio::test]
async fn a_stop_ends_open_calls_within_the_drain_time() {
    let server = TestServer::start().await;
    let mut bridge = HttpBridge::start_with(
        &format!("http://{}", server.addr),
        &["--shutdown-drain-ms", &DRAIN_MS.to_string()],
    )
    .await;
    let (waiter, _, token) = server.root("ws", TrustLevel::Direct).await;
    let (sibling, _, _) = server.root("ws", TrustLevel::Direct).await;
    let waiting = spawn_client(vec![http(
        &bridge.url,
        bearer(&token),
        vec![call(
            "wait_for_session",
            json!({"session_id": sibling.session_id, "timeout_s": 60}),
        )],
    )])
    .await;
    let caller = format!("session:{}", waiter.session_id);
    assert!(
        watches_opened(&server, &sibling.session_id, &caller, 1).await,
        "the wait never opened its watch"
    );

    // A request whose body never comes.
    let addr = bridge
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let mut stalled = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    stalled
        .write_all(
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
              Accept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{",
        )
        .await
        .expect("send the start of a request");

    let stopping = Instant::now();
    let exited = bridge
        .stop_within(Duration::from_millis(DRAIN_MS) + Duration::from_secs(10))
        .await;
    assert!(exited.success(), "a stop is a clean exit: {exited:?}");
    assert!(stopping.elapsed() < Duration::from_secs(30));
    drop((waiting, stalled));
}

fn line(message: Value) -> Vec<u8> {
    let mut line = message.to_string().into_bytes();
    line.push(b'\n');
    line
}

#[tokio::test]
async fn a_stdio_bridge_stops_cleanly_on_sigterm_while_its_client_waits() {
    let server = TestServer::start().await;
    let (waiter, _, _) = server.root("ws", TrustLevel::Direct).await;
    let (sibling, _, _) = server.root("ws", TrustLevel::Direct).await;
    let mut child = server
        .bridge(BRIDGE, &waiter.session_id)
        .await
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the bridge starts");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}});
    stdin.write_all(&line(init)).await.expect("initialize");
    let answer = tokio::time::timeout(STOP_WITHIN, stdout.next_line())
        .await
        .expect("an answer in time")
        .expect("stdout")
        .expect("a line");
    assert!(answer.contains("\"id\":1"), "{answer}");
    let wait = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "wait_for_session",
        "arguments": {"session_id": sibling.session_id, "timeout_s": 60}}});
    stdin
        .write_all(&line(
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        ))
        .await
        .expect("initialized");
    stdin.write_all(&line(wait)).await.expect("the call");
    let caller = format!("session:{}", waiter.session_id);
    assert!(
        watches_opened(&server, &sibling.session_id, &caller, 1).await,
        "the wait never opened its watch"
    );

    // The client stays attached (its stdin open): the signal alone stops it.
    let stopping = Instant::now();
    terminate(child.id().expect("running"));
    let exited = tokio::time::timeout(STOP_WITHIN, child.wait())
        .await
        .expect("the bridge exits on SIGTERM, its input still open")
        .expect("wait");
    assert!(exited.success(), "a stop is a clean exit: {exited:?}");
    assert!(stopping.elapsed() < STOP_WITHIN);
    drop(stdin);
    server.stop().await;
}
