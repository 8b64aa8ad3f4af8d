//! A team of real agents in a real container, traced: the scripted team
//! spawns through the MCP bridge inside the container, and the spans that
//! reach a real OTLP receiver make one trace shaped like the spawn tree.
//! The agents' `TRACEPARENT` (their life span, injected by the runner) is
//! what the bridge forwards, so each spawn call sits under its caller's
//! life, and each child's life under that spawn. The same run's metrics,
//! scraped as Prometheus would, count what happened.
//!
//! Export is configured through the standard variables, read once per
//! process, so the test runs its body in a child process of its own.

use crate::common;

use std::time::Duration;

use common::{pair::*, remove_container};
use troupe_proto::session::SessionStatus;
use troupe_tests::otlp::{
    Received, Receiver, exporting_test, is_life_of, life_of, lookup, sample, scrape,
};

const START_EXEC: &str = "/troupe.runner.v1.RunnerService/StartExec";

#[test]
fn a_team_built_through_the_bridge_is_one_trace_shaped_like_the_tree() {
    require_agent_tools();
    exporting_test(
        "traces::a_team_built_through_the_bridge_is_one_trace_shaped_like_the_tree",
        |receiver| async move {
            let any_port = "127.0.0.1:0".parse().ok();
            let telemetry = troupe_telemetry::init("troupe-traces-test", "warn", any_port).unwrap();
            let metrics = telemetry.metrics_addr.expect("metrics served");
            let pair = Pair::start().await;
            let ws = pair.runner.workspace("traced");
            for name in ["coordinator", "specialist"] {
                pair.agent_command(&ws, name, &["troupe-demo-agent"]);
            }
            let root = pair
                .root(&ws, "coordinator", &team_plan().to_string())
                .await;
            let done = pair
                .wait_status(&root.session_id, SessionStatus::Completed)
                .await;
            let lead = done.children[0].session_id.clone();
            let lead_view = pair.wait_status(&lead, SessionStatus::Completed).await;
            let helper = lead_view.children[0].session_id.clone();
            pair.wait_status(&helper, SessionStatus::Completed).await;
            let trace_id = pair.get(&root.session_id).await.session.unwrap().trace_id;
            assert_eq!(trace_id.len(), 32, "GetSession names the trace");

            let root = root.session_id;
            let spans = lives_of(&receiver, &[&root, &lead, &helper]).await;

            // The same run, as the metrics of both services tell it.
            let text = scrape(metrics).await;
            let value = |name, labels: &[(&str, &str)]| sample(&text, name, labels).unwrap_or(0.0);
            let spawns = |kind, outcome, reason| {
                let labels = [
                    ("troupe_spawn_kind", kind),
                    ("troupe_spawn_outcome", outcome),
                    ("troupe_refusal_reason", reason),
                ];
                value("troupe_spawns_total", &labels)
            };
            assert_eq!(spawns("root", "created", "OK"), 1.0, "{text}");
            assert_eq!(spawns("child", "created", "OK"), 2.0, "{text}");
            assert_eq!(spawns("child", "refused", "DEPTH_EXCEEDED"), 1.0, "{text}");
            assert_eq!(
                value("troupe_exec_start_duration_seconds_count", &[]),
                3.0,
                "{text}"
            );
            // Each agent's first message, "use axum", and two replies up.
            assert!(
                value("troupe_messages_delivered_total", &[]) >= 6.0,
                "{text}"
            );
            let stdout = [("troupe_output_stream", "stdout")];
            assert!(
                value("troupe_agent_output_bytes_total", &stdout) > 0.0,
                "{text}"
            );
            assert_eq!(value("troupe_container_recreations_total", &[]), 0.0);

            // A container removed under the runner is recreated, and counted.
            remove_container(&ws).await;
            let again = pair.root(&ws, "specialist", r#"{"say": "again"}"#).await;
            pair.wait_status(&again.session_id, SessionStatus::Completed)
                .await;
            let text = scrape(metrics).await;
            assert_eq!(
                sample(
                    &text,
                    "troupe_container_recreations_total",
                    &[("troupe_recreation_cause", "gone")]
                ),
                Some(1.0),
                "{text}"
            );
            telemetry.shutdown().await;

            let by_id = |id: &str| spans.iter().find(|s| s.id == id);
            let life = |session: &str| life_of(&spans, session);
            for (session, parent) in [(&lead, &root), (&helper, &lead)] {
                let span = life(session);
                assert_eq!(span.trace, trace_id, "one trace for the tree");
                let spawn = by_id(&span.parent).unwrap_or_else(|| panic!("{spans:#?}"));
                assert_eq!(
                    (spawn.name.as_str(), spawn.get("troupe.session.id")),
                    ("spawn", session.to_string())
                );
                // The spawn is the span of the agent's call, made in its
                // life's context as the bridge forwarded it.
                assert_eq!(spawn.get("rpc.system"), "grpc");
                assert_eq!(
                    spawn.parent,
                    life(parent).id,
                    "called from the parent's life"
                );
                assert_eq!(span.get("troupe.session.status"), "completed");
                // The runner's span of starting its process is in its life.
                assert!(
                    spans
                        .iter()
                        .any(|s| s.name == START_EXEC && s.parent == span.id),
                    "no StartExec under the life of {session}: {spans:#?}"
                );
                assert_eq!(span.get("troupe.exit_code"), "0");
                assert_eq!(span.get("gen_ai.agent.name"), "specialist");
            }
            assert_eq!(life(&root).trace, trace_id);
            assert_eq!(life(&helper).get("troupe.depth"), "2");

            // The helper's own spawn, refused by the depth limit, in its life.
            let refused = spans
                .iter()
                .find(|s| s.get("troupe.refusal.reason") == "DEPTH_EXCEEDED")
                .unwrap_or_else(|| panic!("no refused spawn: {spans:#?}"));
            assert_eq!(
                (&refused.trace, &refused.parent),
                (&trace_id, &life(&helper).id)
            );

            // Messages along one branch are events, not links.
            let senders: Vec<String> = life(&lead)
                .events
                .iter()
                .map(|e| lookup(e, "troupe.message.sender"))
                .collect();
            for sender in [&root, &helper] {
                assert!(
                    senders.contains(&format!("session:{sender}")),
                    "{senders:?}"
                );
            }
            assert!(life(&lead).links.is_empty());
        },
    );
}

/// A session whose agent fails is a life span with an error status, and
/// the exit code and status it ended with.
#[test]
fn a_failed_session_is_an_error_in_its_trace() {
    exporting_test(
        "traces::a_failed_session_is_an_error_in_its_trace",
        |receiver| async move {
            let telemetry = troupe_telemetry::init("troupe-traces-test", "warn", None).unwrap();
            let pair = Pair::start().await;
            let ws = pair.runner.workspace("faulty");
            pair.agent(&ws, "faulty", "echo giving up; exit 3");
            pair.agent(&ws, "fine", "true");
            let failing = pair.root(&ws, "faulty", "go").await.session_id;
            let passing = pair.root(&ws, "fine", "go").await.session_id;
            pair.wait_status(&failing, SessionStatus::Failed).await;
            pair.wait_status(&passing, SessionStatus::Completed).await;
            let spans = lives_of(&receiver, &[&failing, &passing]).await;
            let failed = life_of(&spans, &failing);
            assert!(
                failed.error,
                "a failed session's life is an error: {failed:?}"
            );
            assert_eq!(failed.get("troupe.session.status"), "failed");
            assert_eq!(failed.get("troupe.exit_code"), "3");
            let completed = life_of(&spans, &passing);
            assert!(!completed.error, "{completed:?}");
            assert_eq!(completed.get("troupe.exit_code"), "0");
            telemetry.shutdown().await;
        },
    );
}

/// The spans received once the life spans of all `sessions` are among them.
async fn lives_of(receiver: &Receiver, sessions: &[&str]) -> Vec<Received> {
    let deadline = tokio::time::Instant::now() + MINUTE;
    loop {
        let spans = receiver.spans();
        let all = sessions
            .iter()
            .all(|session| spans.iter().any(|s| is_life_of(s, session)));
        if all {
            return spans;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "life spans missing: {spans:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
