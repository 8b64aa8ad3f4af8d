//! The session service and the runner together, in one run on one engine:
//!
//! - spawn to first output: from `CreateSession` (a child that prints one
//!   line) to its `output` event as a watcher of the tree sees it, against
//!   a bare `docker exec` of the same command to its first byte;
//! - message delivery: `SendMessage` from one agent's session to a running
//!   agent until the reply says `DELIVERED` (its bytes are in the agent's
//!   stdin pipe), and until the agent's echo of it comes back to a watcher,
//!   each followed by a timed no-op call (a health check) that meets the
//!   same moments of the machine; and the same as an agent sends it, a
//!   `send_message` tool call through `troupe-mcp` until its result says
//!   "delivered".
//!
//! `cargo bench -p troupe-runner-svc --bench team` (needs DOCKER_HOST and the
//! image, as the tests do, and `troupe-mcp` built: `cargo build --release -p
//! troupe-mcp-bridge`).

#[path = "../tests/common/mod.rs"]
mod common;
mod measure;

use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use measure::*;
use rmcp::{ServiceExt, model::CallToolRequestParams, transport::TokioChildProcess};
use troupe_proto::session::{
    CreateRootSessionRequest, CreateSessionRequest, DeliveryStatus, EventKind, GetSessionRequest,
    SendMessageRequest, SessionEvent, SessionStatus, TrustLevel, WatchSessionsRequest,
    session_event::Detail,
};
use troupe_tests::{TestServer, bench::Noop};

const SPAWNS: usize = 40;
const MESSAGES: usize = 1000;

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench());
}

async fn bench() {
    let runner = TestRunner::driven().await;
    let endpoint = format!("http://{}", runner.addr);
    let server = TestServer::start_with(|c| {
        c.runner = Some(endpoint);
        c.limits.max_children = 10_000;
        c.limits.max_tree_sessions = 10_000;
        c.limits.max_active_per_workspace = 10_000;
    })
    .await;
    let ws = runner.workspace("bench");
    let agent = |name: &str, script: &str| {
        let command = serde_json::to_string(&["sh", "-c", script]).unwrap();
        server.write_agent_text(
            Some(&ws),
            name,
            &format!("---\nname: {name}\ndescription: bench\ncommand: {command}\n---\n"),
        );
    };
    agent("holder", "sleep 100000");
    agent("printer", "echo x");
    agent("echo", "cat");
    let mut operator = server.operator().await;
    let root = operator
        .create_root_session(CreateRootSessionRequest {
            workspace_id: ws.clone(),
            trust_level: TrustLevel::Direct as i32,
            title: "bench".into(),
            agent_name: "holder".into(),
            initial_message: "hold".into(),
            request_id: String::new(),
            budget: None,
            writable_paths: Vec::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    wait_running(&server, &root.session_id).await;
    let mut parent = server.act_as(&root.session_id).await;

    let docker = bollard::Docker::connect_with_defaults()
        .unwrap()
        .negotiate_version()
        .await
        .unwrap();
    let container = troupe_runner_svc::docker::Engine::container_name(&ws);
    let uid = format!("{}:{}", runner.config.uid_base, runner.config.uid_base);

    // Spawn to first output, interleaved with bare execs.
    let mut watch = operator
        .watch_sessions(WatchSessionsRequest {
            tree_id: root.tree_id.clone(),
            live_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut bare = Vec::new();
    let mut troupe = Vec::new();
    for _ in 0..SPAWNS {
        bare.push(bare_first_byte(&docker, &container, &uid, &["sh", "-c", "echo x"]).await);
        let t = Instant::now();
        let child = parent
            .create_session(CreateSessionRequest {
                title: "printer".into(),
                agent_name: "printer".into(),
                initial_message: "go".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .session
            .unwrap();
        until(&mut watch, &child.session_id, |e| {
            e.kind() == EventKind::Output
        })
        .await;
        troupe.push(millis(t.elapsed()));
        // Untimed: the child's end, as the bare exec's is awaited, so that
        // each round starts with nothing of the last one still running.
        until(&mut watch, &child.session_id, |e| {
            matches!(e.kind(), EventKind::Completed | EventKind::Failed)
        })
        .await;
    }
    let (b50, b99) = percentiles(&mut bare);
    let (t50, t99) = percentiles(&mut troupe);
    println!("spawn to first output over {SPAWNS} runs (ms, p50 / p99):");
    println!("  bare docker exec:              {b50:.1} / {b99:.1}");
    println!("  CreateSession to output event: {t50:.1} / {t99:.1}");
    println!("  ratio (p50):                   {:.2}", t50 / b50);

    // Messages to a running agent that echoes them.
    let echo = parent
        .create_session(CreateSessionRequest {
            title: "echo".into(),
            agent_name: "echo".into(),
            initial_message: "ready".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    wait_running(&server, &echo.session_id).await;
    let noop = Noop::connect(server.addr).await;
    let mut delivered = Vec::new();
    let mut echoed = Vec::new();
    let mut floor = Vec::new();
    for i in 0..MESSAGES {
        let text = format!("ping-{i}");
        let t = Instant::now();
        let reply = parent
            .send_message(SendMessageRequest {
                session_id: echo.session_id.clone(),
                message: text.clone(),
                request_id: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        delivered.push(millis(t.elapsed()));
        assert_eq!(reply.delivery(), DeliveryStatus::Delivered);
        until(&mut watch, &echo.session_id, |e| {
            matches!(&e.detail, Some(Detail::Output(out))
                if String::from_utf8_lossy(&out.data).contains(&text))
        })
        .await;
        echoed.push(millis(t.elapsed()));
        // The same moments of the machine, for a call that does no work.
        let t = Instant::now();
        noop.call().await;
        floor.push(millis(t.elapsed()));
    }
    // The same messages as an agent sends them: a `send_message` tool call
    // to `troupe-mcp` over stdio, as the agent's MCP client makes it, until
    // its result says "delivered" (the bytes are in the agent's stdin pipe).
    let bridge = server.bridge(bridge_binary(), &root.session_id).await;
    let client =
        ().serve(TokioChildProcess::new(bridge).expect("the bridge starts"))
            .await
            .expect("MCP handshake");
    let mut tool = Vec::new();
    for i in 0..MESSAGES {
        let text = format!("tool-{i}");
        let serde_json::Value::Object(args) =
            serde_json::json!({"session_id": echo.session_id, "message": text})
        else {
            unreachable!("an object")
        };
        let t = Instant::now();
        let result = client
            .call_tool(CallToolRequestParams::new("send_message").with_arguments(args))
            .await
            .expect("send_message");
        tool.push(millis(t.elapsed()));
        let value = result.structured_content.expect("a structured result");
        assert_eq!(value["delivery"], "delivered", "{value}");
        // Untimed: the echo, so the next message meets an idle agent.
        until(&mut watch, &echo.session_id, |e| {
            matches!(&e.detail, Some(Detail::Output(out))
                if String::from_utf8_lossy(&out.data).contains(&text))
        })
        .await;
    }
    let (d50, d99) = percentiles(&mut delivered);
    let (e50, e99) = percentiles(&mut echoed);
    let (f50, f99) = percentiles(&mut floor);
    let (m50, m99) = percentiles(&mut tool);
    println!("messages to a running agent over {MESSAGES} (ms, p50 / p99):");
    println!("  SendMessage until DELIVERED:   {d50:.1} / {d99:.1}");
    println!("  until its echo is watched:     {e50:.1} / {e99:.1}");
    println!("  a no-op call after each:       {f50:.1} / {f99:.1}");
    println!("  send_message tool call, until delivered: {m50:.1} / {m99:.1}");
}

/// `troupe-mcp`, built beside the runner (`cargo build --release -p
/// troupe-mcp-bridge` before this bench).
fn bridge_binary() -> std::path::PathBuf {
    let path =
        std::path::Path::new(env!("CARGO_BIN_EXE_troupe-runner")).with_file_name("troupe-mcp");
    assert!(
        path.is_file(),
        "{} is missing: build it with `cargo build --release -p troupe-mcp-bridge`",
        path.display()
    );
    path
}

/// Reads the watch until an event of `session_id` that `wanted` accepts.
async fn until(
    watch: &mut tonic::Streaming<SessionEvent>,
    session_id: &str,
    wanted: impl Fn(&SessionEvent) -> bool,
) {
    loop {
        let event = watch.next().await.unwrap().unwrap();
        if event.session_id == session_id && wanted(&event) {
            return;
        }
    }
}

async fn wait_running(server: &TestServer, id: &str) {
    let mut operator = server.operator().await;
    for _ in 0..600 {
        let got = operator
            .get_session(GetSessionRequest {
                session_id: id.into(),
            })
            .await
            .unwrap()
            .into_inner();
        if got.session.unwrap().status() == SessionStatus::Running {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{id} never ran");
}
