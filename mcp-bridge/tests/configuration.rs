//! What the real `troupe-mcp` makes of its environment and flags: a stdio
//! bridge without its token or endpoint says which is missing; a token
//! that is empty, or that a request header cannot carry, stops it at
//! start saying so; `--allowed-host` adds a `Host` name the HTTP endpoint
//! answers, and any other name is still refused.

use crate::common;

use std::{process::Stdio, time::Duration};

use common::*;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use troupe_tests::TestServer;

/// Runs the stdio bridge with `token`; returns its stderr, after checking
/// that it failed.
fn start_with_token(token: &str) -> String {
    let output = std::process::Command::new(BRIDGE)
        .env_clear()
        .envs(passed_on())
        .env("TROUPE_SESSION_TOKEN", token)
        .env("TROUPE_SESSION_ENDPOINT", "unix:///nowhere/session.sock")
        .stdin(Stdio::null())
        .output()
        .expect("the bridge runs");
    assert!(!output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_token_that_cannot_be_sent_stops_a_stdio_bridge_at_start() {
    let blank = start_with_token("   ");
    assert!(
        blank.contains("TROUPE_SESSION_TOKEN is empty; it must hold the calling session's token"),
        "{blank}"
    );
    let two_lines = start_with_token("one\ntwo");
    assert!(
        two_lines.contains("the session token holds characters a header cannot carry"),
        "{two_lines}"
    );
}

/// The status line of the answer to an MCP `initialize` sent to `address`
/// with `host` as its `Host` header.
async fn initialize_as(address: &str, host: &str) -> String {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = TcpStream::connect(address).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("request");
    let mut head = vec![0; 64];
    let n = tokio::time::timeout(Duration::from_secs(20), stream.read(&mut head))
        .await
        .expect("an answer in time")
        .expect("read");
    let head = String::from_utf8_lossy(&head[..n]).into_owned();
    head.lines().next().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn an_allowed_host_is_answered_and_others_are_refused() {
    let server = TestServer::start().await;
    let bridge = HttpBridge::start_with(
        &format!("http://{}", server.addr),
        &["--allowed-host", "bridge.example"],
    )
    .await;
    let address = bridge
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let loopback = address.clone();
    for (host, status) in [
        ("bridge.example", "HTTP/1.1 200 OK"),
        (loopback.as_str(), "HTTP/1.1 200 OK"),
        ("elsewhere.example", "HTTP/1.1 403 Forbidden"),
    ] {
        assert_eq!(initialize_as(&address, host).await, status, "Host: {host}");
    }
    bridge.stop().await;
    server.stop().await;
}

#[test]
fn stdio_without_its_environment_says_what_is_missing() {
    let run = |env: &[(&str, &str)]| {
        let output = std::process::Command::new(BRIDGE)
            .env_clear()
            .envs(env.iter().copied())
            .envs(passed_on())
            .stdin(Stdio::null())
            .output()
            .expect("bridge runs");
        assert!(!output.status.success());
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let no_token = run(&[]);
    assert!(
        no_token.contains("TROUPE_SESSION_TOKEN is not set"),
        "{no_token}"
    );
    let no_endpoint = run(&[("TROUPE_SESSION_TOKEN", "t")]);
    assert!(
        no_endpoint.contains("TROUPE_SESSION_ENDPOINT is not set"),
        "{no_endpoint}"
    );
    assert!(no_endpoint.contains("unix://"), "{no_endpoint}");
}
