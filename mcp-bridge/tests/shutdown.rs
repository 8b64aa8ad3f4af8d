//! A stop of `troupe-mcp http` (SIGTERM) while an agent's call is open and
//! a client is stalled halfway through sending a request: the bridge exits
//! within its drain time, whatever its clients do.

mod common;

use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;

use common::*;
use serde_json::json;
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
    let pid = bridge.child.id().expect("running").to_string();
    let signalled = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    assert!(signalled.success());
    let exited = tokio::time::timeout(
        Duration::from_millis(DRAIN_MS) + Duration::from_secs(10),
        bridge.child.wait(),
    )
    .await
    .expect("the bridge exits within its drain time, a client stalled")
    .expect("wait");
    assert!(exited.success(), "a stop is a clean exit: {exited:?}");
    assert!(stopping.elapsed() < Duration::from_secs(30));
    drop((waiting, stalled));
}
