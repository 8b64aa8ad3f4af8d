//! The seeds' three figures through the MCP bridge: an MCP client (rmcp)
//! drives `troupe-mcp` over stdio, as an agent's MCP client does, and times
//! `tools/call` of `create_session`, `send_message` and
//! `list_workspace_sessions` from the request to the parsed result. The
//! bridge reaches a real session service in this process over its Unix
//! socket, as agents in workspace containers do. Prints p50/p99 per tool
//! as a Markdown table (the figures in BENCHMARKS.md).
//!
//! Run: `cargo bench -p troupe-mcp-bridge --bench tools`

use rmcp::{
    RoleClient, ServiceExt,
    model::{CallToolRequestParams, CallToolResult},
    service::RunningService,
    transport::TokioChildProcess,
};
use serde_json::{Value, json};
use troupe_proto::session::TrustLevel;
use troupe_tests::{
    TestServer,
    bench::{measure, ms, unlimited},
    child,
};

const BRIDGE: &str = env!("CARGO_BIN_EXE_troupe-mcp");
const SAMPLES: usize = 500;
/// Sessions in the workspace when it is listed.
const LISTED: usize = 100;

/// Calls a tool; panics on a refusal, which would void the figure.
async fn call(client: &RunningService<RoleClient, ()>, name: &'static str, args: Value) -> Value {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    let result: CallToolResult = client
        .call_tool(CallToolRequestParams::new(name).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_ne!(result.is_error, Some(true), "{name} refused: {result:?}");
    result.structured_content.expect("a structured result")
}

#[tokio::main]
async fn main() {
    let server = TestServer::start_with(unlimited).await;
    let (root, mut as_root, _) = server.root("bench-mcp", TrustLevel::Direct).await;
    // The workspace the list measures: LISTED active sessions.
    for i in 1..LISTED {
        as_root
            .create_session(child(&format!("listed {i}")))
            .await
            .expect("seed");
    }
    let mut bridge = server.bridge(BRIDGE, &root.session_id).await;
    bridge.env("TROUPE_SESSION_ID", &root.session_id);
    let client =
        ().serve(TokioChildProcess::new(bridge).expect("the bridge starts"))
            .await
            .expect("MCP handshake");

    let mut rows = Vec::new();
    let (p50, p99) = measure(SAMPLES, |_| {
        let client = &client;
        async move {
            let listed = call(client, "list_workspace_sessions", json!({})).await;
            assert_eq!(listed["sessions"].as_array().map(Vec::len), Some(LISTED));
        }
    })
    .await;
    rows.push((
        "list_workspace_sessions (100 sessions)",
        SAMPLES,
        p50,
        p99,
        50,
    ));

    let (p50, p99) = measure(SAMPLES, |i| {
        let client = &client;
        async move {
            call(
                client,
                "create_session",
                json!({"title": format!("child {i}"), "agent_name": "worker", "initial_message": "go"}),
            )
            .await;
        }
    })
    .await;
    rows.push(("create_session", SAMPLES, p50, p99, 100));

    let target = call(
        &client,
        "create_session",
        json!({"title": "inbox", "agent_name": "worker", "initial_message": "start"}),
    )
    .await["session"]["session_id"]
        .as_str()
        .expect("a session id")
        .to_owned();
    let (p50, p99) = measure(SAMPLES, |i| {
        let client = &client;
        let target = target.clone();
        async move {
            call(
                client,
                "send_message",
                json!({"session_id": target, "message": format!("message {i}")}),
            )
            .await;
        }
    })
    .await;
    rows.push(("send_message", SAMPLES, p50, p99, 50));

    println!("| tool | samples | p50 (ms) | p99 (ms) | seeds' bound (ms) |");
    println!("|---|---|---|---|---|");
    for (name, samples, p50, p99, bound) in rows {
        println!(
            "| {name} | {samples} | {} | {} | < {bound} |",
            ms(p50),
            ms(p99)
        );
    }
    let _ = client.cancel().await;
    server.stop().await;
}
