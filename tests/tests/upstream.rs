//! The scripted upstream (`troupe_tests::upstream`) speaks the Messages API
//! as documented: turns in order, JSON or server-sent events with the
//! scripted usage, `count_tokens` taking no turn, the API's error shape when
//! no turn is left or the path is unknown, and every request recorded with
//! its key. Driven by hand-written HTTP/1.1 over TCP and a Unix socket.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use troupe_tests::upstream::{Block, Turn, Upstream, Usage};

const MINUTE: Duration = Duration::from_secs(60);

/// Sends one request (`Connection: close`) and returns the status and body.
async fn call(
    mut io: impl AsyncRead + AsyncWrite + Unpin,
    path: &str,
    auth: &str,
    body: &Value,
) -> (u16, String) {
    let body = body.to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: upstream\r\n{auth}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    io.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(MINUTE, io.read_to_end(&mut answer))
        .await
        .expect("an answer")
        .unwrap();
    let answer = String::from_utf8(answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    let status = head[9..12].parse().unwrap();
    (status, body.to_owned())
}

async fn tcp(upstream: &Upstream) -> tokio::net::TcpStream {
    let addr = upstream.base_url().replace("http://", "");
    tokio::net::TcpStream::connect(addr).await.unwrap()
}

fn messages(stream: bool) -> Value {
    json!({"model": "claude-test", "max_tokens": 64, "stream": stream,
           "messages": [{"role": "user", "content": "hi"}]})
}

/// The `data:` of each event, in order, with its `event:` name checked.
fn events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let (name, data) = e.split_once('\n').unwrap();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(name.strip_prefix("event: "), data["type"].as_str(), "{e}");
            data
        })
        .collect()
}

#[tokio::test]
async fn turns_are_given_in_order_as_json_or_events_and_every_request_is_recorded() {
    let usage = Usage {
        input_tokens: 100,
        output_tokens: 20,
        cache_read_input_tokens: 3,
        cache_creation_input_tokens: 4,
    };
    let upstream = Upstream::tcp(vec![
        Turn::text("first").with_usage(usage),
        Turn {
            blocks: vec![
                Block::Text("calling".into()),
                Block::ToolUse {
                    id: "toolu_1".into(),
                    name: "mcp__troupe__create_session".into(),
                    input: json!({"agent_name": "worker"}),
                },
            ],
            stop_reason: "tool_use".into(),
            usage,
            fault: None,
        },
    ])
    .await;

    let (status, body) = call(
        tcp(&upstream).await,
        "/v1/messages",
        "x-api-key: key-1",
        &messages(false),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let message: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(message["type"], "message");
    assert_eq!(message["model"], "claude-test");
    assert_eq!(
        message["content"],
        json!([{"type": "text", "text": "first"}])
    );
    assert_eq!(message["stop_reason"], "end_turn");
    assert_eq!(
        message["usage"],
        json!({"input_tokens": 100, "output_tokens": 20,
               "cache_read_input_tokens": 3, "cache_creation_input_tokens": 4})
    );

    // count_tokens takes no turn.
    let (status, body) = call(
        tcp(&upstream).await,
        "/v1/messages/count_tokens",
        "x-api-key: key-1",
        &messages(false),
    )
    .await;
    assert_eq!(status, 200);
    assert!(serde_json::from_str::<Value>(&body).unwrap()["input_tokens"].is_u64());

    let (status, body) = call(
        tcp(&upstream).await,
        "/v1/messages?beta=true",
        "authorization: Bearer key-2",
        &messages(true),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let events = events(&body);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(events[0]["message"]["usage"]["input_tokens"], 100);
    assert_eq!(events[0]["message"]["usage"]["cache_read_input_tokens"], 3);
    assert_eq!(
        events[2]["delta"],
        json!({"type": "text_delta", "text": "calling"})
    );
    assert_eq!(
        events[4]["content_block"]["name"],
        "mcp__troupe__create_session"
    );
    assert_eq!(events[5]["delta"]["type"], "input_json_delta");
    let input: Value =
        serde_json::from_str(events[5]["delta"]["partial_json"].as_str().unwrap()).unwrap();
    assert_eq!(input, json!({"agent_name": "worker"}));
    assert_eq!(events[7]["delta"]["stop_reason"], "tool_use");
    assert_eq!(events[7]["usage"]["output_tokens"], 20);
    assert_eq!(upstream.turns_left(), 0);

    let seen = upstream.wait_for_requests(3, MINUTE).await;
    let summary: Vec<(&str, Option<&str>, bool)> = seen
        .iter()
        .map(|r| (r.uri.as_str(), r.api_key(), r.streams()))
        .collect();
    assert_eq!(
        summary,
        [
            ("/v1/messages", Some("key-1"), false),
            ("/v1/messages/count_tokens", Some("key-1"), false),
            ("/v1/messages?beta=true", Some("key-2"), true),
        ]
    );
    assert_eq!(seen[2].body["model"], "claude-test");
}

#[tokio::test]
async fn no_turn_left_and_unknown_paths_are_api_errors_on_a_unix_socket_too() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::unix(&dir.path().join("u.sock"), vec![]).await;
    let unix = || tokio::net::UnixStream::connect(upstream.socket());
    let (status, body) = call(
        unix().await.unwrap(),
        "/v1/messages",
        "x-api-key: k",
        &messages(true),
    )
    .await;
    assert_eq!(status, 400);
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no turn left")
    );

    let (status, body) = call(
        unix().await.unwrap(),
        "/v1/elsewhere",
        "x-api-key: k",
        &json!({}),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["type"],
        "not_found_error"
    );

    // A turn pushed later is given next.
    upstream.push(Turn::text("late"));
    let (status, body) = call(
        unix().await.unwrap(),
        "/v1/messages",
        "x-api-key: k",
        &messages(false),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["content"][0]["text"],
        "late"
    );
    assert_eq!(upstream.requests().len(), 3);
}
