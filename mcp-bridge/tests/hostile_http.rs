//! The HTTP bridge's listener against one address that floods it with
//! stalled request heads: past the per-peer cap a connection is closed at
//! once, unread; the stalled heads are cut after the header timeout; and
//! then a whole request is answered.

use crate::common;

use std::{net::SocketAddr, time::Duration};

use common::HttpBridge;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use troupe_tests::{TestServer, floods};

const PER_PEER: usize = 8;
const HEADER_TIMEOUT_SECS: u64 = 3;

/// The bridge's address, from its URL (`http://127.0.0.1:PORT/mcp`).
fn address(url: &str) -> SocketAddr {
    let rest = url.trim_start_matches("http://");
    rest[..rest.find('/').unwrap_or(rest.len())]
        .parse()
        .expect("an address")
}

#[tokio::test]
async fn stalled_heads_are_capped_per_peer_and_cut_after_the_header_timeout() {
    let server = TestServer::start().await;
    let bridge = HttpBridge::start_with(
        &format!("http://{}", server.addr),
        &[
            "--max-connections-per-peer",
            &PER_PEER.to_string(),
            "--header-timeout-secs",
            &HEADER_TIMEOUT_SECS.to_string(),
        ],
    )
    .await;
    let addr = address(&bridge.url);
    let head = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
    // Stalled heads: cut by the header timeout.
    let timeout = Duration::from_secs(HEADER_TIMEOUT_SECS);
    floods::capped_then_cut(addr, PER_PEER, head, timeout).await;

    // The flood gone, a whole request is answered.
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .expect("a request");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("answered in time")
        .expect("read");
    assert!(
        answer.starts_with(b"HTTP/1.1 "),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    bridge.stop().await;
    server.stop().await;
}
