//! `troupe-mcp`'s own spans at a real OTLP receiver: each tool call is an
//! `execute_tool` span under the agent's `TRACEPARENT`, and the session
//! service's span of the call sits under it, so a trace shows which tool
//! call of which agent made each spawn. A refused call's span is an error.
//!
//! Export is configured through the standard variables, read once per
//! process, so the test runs its body in a child process of its own (whose
//! in-process session service exports too), and the bridge, a child of
//! that, inherits them.

use rmcp::{
    ServiceExt,
    model::{CallToolRequestParams, CallToolResult},
    transport::TokioChildProcess,
};
use serde_json::{Value, json};
use troupe_proto::session::TrustLevel;
use troupe_tests::{
    TestServer,
    otlp::{Received, exporting_test, lookup},
};

const BRIDGE: &str = env!("CARGO_BIN_EXE_troupe-mcp");

/// The agent's own span in its tree's trace, as its `TRACEPARENT` names it.
const AGENT_SPAN: &str = "00f067aa0ba902b7";

async fn call(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    name: &'static str,
    args: Value,
) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    client
        .call_tool(CallToolRequestParams::new(name).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn each_tool_call_is_a_span_under_the_agent_and_over_the_service() {
    exporting_test(
        "traces::each_tool_call_is_a_span_under_the_agent_and_over_the_service",
        |receiver| async move {
            let telemetry = troupe_telemetry::init("troupe-session", "warn", None).unwrap();
            let server = TestServer::start().await;
            let (root, _, _) = server.root("alpha", TrustLevel::Direct).await;
            let trace = root.trace_id.clone();
            assert_eq!(trace.len(), 32, "the root is traced: {root:?}");
            let mut bridge = server.bridge(BRIDGE, &root.session_id).await;
            bridge.env("TRACEPARENT", format!("00-{trace}-{AGENT_SPAN}-01"));
            let client =
                ().serve(TokioChildProcess::new(bridge).expect("the bridge starts"))
                    .await
                    .expect("MCP handshake");
            let created = call(
                &client,
                "create_session",
                json!({"title": "traced", "agent_name": "worker", "initial_message": "go"}),
            )
            .await;
            assert_ne!(created.is_error, Some(true), "{created:?}");
            let refused = call(
                &client,
                "create_session",
                json!({"title": "nobody", "agent_name": "no-such-agent", "initial_message": "go"}),
            )
            .await;
            assert_eq!(refused.is_error, Some(true), "{refused:?}");
            telemetry.shutdown().await;
            // The bridge exports its batches every 100 ms, and what is left when
            // its input closes.
            client.cancel().await.expect("the bridge stops");
            let tool_spans = |spans: &[Received]| {
                spans
                    .iter()
                    .filter(|s| s.name == "execute_tool create_session")
                    .count()
            };
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while tool_spans(&receiver.spans()) < 2 && std::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }

            let spans = receiver.spans();
            let tools: Vec<&Received> = spans
                .iter()
                .filter(|s| s.name == "execute_tool create_session")
                .collect();
            assert_eq!(tools.len(), 2, "one span per tool call: {spans:#?}");
            for tool in &tools {
                assert_eq!(lookup(&tool.resource, "service.name"), "troupe-mcp");
                assert_eq!(
                    (tool.trace.as_str(), tool.parent.as_str()),
                    (trace.as_str(), AGENT_SPAN),
                    "under the agent's span"
                );
                assert_eq!(tool.get("gen_ai.operation.name"), "execute_tool");
                assert_eq!(tool.get("gen_ai.tool.name"), "create_session");
            }
            assert_eq!(
                tools.iter().map(|t| t.error).collect::<Vec<_>>(),
                [false, true],
                "the refused call's span is an error"
            );
            // The service's span of each call, its spawn span, hangs under
            // the bridge's.
            for tool in &tools {
                let spawn = spans
                    .iter()
                    .find(|s| s.name == "spawn" && s.parent == tool.id)
                    .unwrap_or_else(|| panic!("no spawn under {tool:?}: {spans:#?}"));
                assert_eq!(spawn.trace, trace);
                assert_eq!(lookup(&spawn.resource, "service.name"), "troupe-session");
            }
            server.stop().await;
        },
    );
}
