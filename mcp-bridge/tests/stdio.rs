//! A client that sends what the bridge cannot read always gets an answer:
//! over stdio, a line too long, not JSON or nested too deep is answered
//! with a JSON-RPC error (id null) and the session goes on; over HTTP, a
//! body too long is answered 413. A line the client leaves unfinished when
//! it goes is dropped, and the bridge exits cleanly. Raw JSON-RPC to the
//! real `troupe-mcp`, every read under a deadline, so a silent bridge fails
//! the test instead of hanging it.

use crate::common;

use std::{process::Stdio, time::Duration};

use common::{BRIDGE, HttpBridge, TOOLS};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines},
    net::TcpStream,
    process::{ChildStdin, ChildStdout},
};
use troupe_proto::session::TrustLevel;
use troupe_tests::TestServer;

const ANSWER_WITHIN: Duration = Duration::from_secs(20);

/// The bridge's stdio, as a raw JSON-RPC client sees it.
struct Peer {
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Peer {
    async fn send(&mut self, line: &[u8]) {
        self.stdin.write_all(line).await.expect("written");
        self.stdin.flush().await.expect("flushed");
    }

    /// The next message, which must come within [`ANSWER_WITHIN`].
    async fn answer(&mut self, after: &str) -> Value {
        let line = tokio::time::timeout(ANSWER_WITHIN, self.stdout.next_line())
            .await
            .unwrap_or_else(|_| panic!("no answer within {ANSWER_WITHIN:?} after {after}"))
            .expect("stdout")
            .unwrap_or_else(|| panic!("the bridge closed its stdout after {after}"));
        serde_json::from_str(&line).expect("a JSON message")
    }

    async fn error(&mut self, after: &str, code: i64) -> String {
        let answer = self.answer(after).await;
        assert_eq!(answer["id"], Value::Null, "{after}: {answer}");
        assert_eq!(answer["error"]["code"], code, "{after}: {answer}");
        answer["error"]["message"]
            .as_str()
            .expect("a message")
            .to_owned()
    }
}

fn request(id: u64, method: &str, params: Value) -> Vec<u8> {
    let mut line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
        .to_string()
        .into_bytes();
    line.push(b'\n');
    line
}

#[tokio::test(flavor = "multi_thread")]
async fn every_unreadable_stdio_line_is_answered_and_the_session_goes_on() {
    let server = TestServer::start().await;
    let (root, _, _) = server.root("alpha", TrustLevel::Direct).await;
    let mut child = server
        .bridge(BRIDGE, &root.session_id)
        .await
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the bridge starts");
    let pid = child.id().expect("pid");
    let mut peer = Peer {
        stdin: child.stdin.take().expect("stdin"),
        stdout: BufReader::new(child.stdout.take().expect("stdout")).lines(),
    };
    let init = json!({
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    });
    peer.send(&request(1, "initialize", init)).await;
    assert_eq!(peer.answer("initialize").await["id"], 1);
    peer.send(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
        .await;

    // 64 MiB on one line, written as it comes: answered as soon as it is
    // too long, and never held whole.
    let chunk = vec![b' '; 1 << 20];
    peer.send(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\",\"params\":{}")
        .await;
    for _ in 0..64 {
        peer.send(&chunk).await;
    }
    peer.send(b"}\n").await;
    let message = peer.error("a 64 MiB line", -32600).await;
    assert!(message.contains("too large"), "{message}");
    let peak = peak_memory_kib(pid);
    assert!(peak < 48 * 1024, "the bridge held {peak} KiB");

    let deep = [b"[".repeat(100_000), b"\n".to_vec()].concat();
    peer.send(&deep).await;
    let message = peer.error("100,000 [", -32700).await;
    assert!(message.contains("deeper than"), "{message}");
    let balanced = format!("{}{}\n", "[".repeat(200), "]".repeat(200));
    peer.send(balanced.as_bytes()).await;
    let message = peer.error("200 nested arrays", -32700).await;
    assert!(message.contains("deeper than"), "{message}");
    peer.send(b"not json\n").await;
    peer.error("a line that is not JSON", -32700).await;
    peer.send(b"\"\xff\xfe\"\n").await;
    let message = peer.error("a line that is not UTF-8", -32700).await;
    assert!(message.contains("UTF-8"), "{message}");
    // JSON that is no JSON-RPC message: rmcp's own answer.
    peer.send(b"{\"hello\":1}\n").await;
    peer.error("JSON that is no message", -32600).await;

    // The session goes on.
    peer.send(&request(3, "tools/list", json!({}))).await;
    let listed = peer.answer("tools/list").await;
    assert_eq!(listed["id"], 3, "{listed}");
    assert_eq!(
        listed["result"]["tools"].as_array().map(Vec::len),
        Some(TOOLS.len())
    );
    // The client leaves halfway through a line: the bridge drops the
    // unfinished line unanswered and ends with its input, cleanly.
    peer.send(&request(4, "tools/list", json!({}))[..20]).await;
    let Peer { stdin, mut stdout } = peer;
    drop(stdin);
    let last = tokio::time::timeout(ANSWER_WITHIN, stdout.next_line())
        .await
        .expect("stdout ends in time")
        .expect("stdout");
    assert_eq!(last, None, "an unfinished line is not answered");
    let exited = tokio::time::timeout(ANSWER_WITHIN, child.wait())
        .await
        .expect("the bridge exits once its input ends")
        .expect("wait");
    assert!(exited.success(), "{exited:?}");
    server.stop().await;
}

/// The most memory the process has held, in KiB (`VmHWM`).
fn peak_memory_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

#[tokio::test]
async fn an_http_body_too_long_is_answered_413() {
    let server = TestServer::start().await;
    let bridge = HttpBridge::start(&format!("http://{}", server.addr)).await;
    let address = bridge
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let body = vec![b' '; 5 << 20];
    let mut stream = TcpStream::connect(&address).await.expect("connect");
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    // The server may answer before it has read the whole body.
    let _ = stream.write_all(&body).await;
    let mut answer = vec![0; 1024];
    let n = tokio::time::timeout(ANSWER_WITHIN, stream.read(&mut answer))
        .await
        .expect("an answer in time")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    bridge.stop().await;
    server.stop().await;
}
