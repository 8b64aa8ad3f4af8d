//! A team of the real Claude Code whose children hand back their results:
//! a direct coordinator gives work to two sandboxed workers, one `sync` and
//! one `callback`; each worker calls `mcp__troupe__finish` with its answer.
//! The coordinator's model sees each result (in the tool's answer, in the
//! callback notice, each read from its JSON), nobody is terminated, each worker ends `completed`
//! with its result, and no worker's model ever sees its direct parent's id.

use crate::common;

use std::time::Duration;

use common::{
    claude::{self, Team},
    *,
};
use serde_json::{Value, json};
use troupe_proto::session as pb;
use troupe_tests::upstream::{Turn, Upstream};

const KEY: &str = "sk-ant-results-provider-key";
const MODEL: &str = "claude-results-test";
const COORDINATOR: &str = "COORDINATE-RESULTS-3b9d";
const SYNC_WORKER: &str = "SYNC-WORK-e41a";
const CALLBACK_WORKER: &str = "CALLBACK-WORK-07c2";
const SYNC_RESULT: &str = "RESULT-SYNC: six times seven is 42";
const CALLBACK_RESULT: &str = "RESULT-CALLBACK: the sky is blue";

fn finish(result: &str) -> Turn {
    Turn::tool_use(
        "toolu_finish",
        "mcp__troupe__finish",
        json!({"result": result, "outcome": "success"}),
    )
}

fn spawn(id: &str, marker: &str, mode: &str) -> Turn {
    Turn::tool_use(
        id,
        "mcp__troupe__create_session",
        json!({"title": marker, "agent_name": "claude", "trust_level": "sandboxed",
               "mode": mode, "initial_message": format!("{marker}: do your part, then finish")}),
    )
}

fn first_message(body: &Value) -> String {
    body["messages"][0].to_string()
}

/// The content blocks of every message the coordinator's model was sent.
fn coordinator_blocks(upstream: &Upstream) -> Vec<Value> {
    upstream
        .requests()
        .iter()
        .filter(|r| first_message(&r.body).contains(COORDINATOR))
        .flat_map(|r| r.body["messages"].as_array().cloned().unwrap_or_default())
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// The `finished` result in the sync create's answer, as the coordinator's
/// model was given it (the tool's JSON answer).
fn sync_result(blocks: &[Value]) -> Option<String> {
    blocks
        .iter()
        .filter(|b| b["type"] == "tool_result" && b["tool_use_id"] == "toolu_sync")
        .find_map(|b| {
            let answer: Value = serde_json::from_str(b["content"].as_str()?).ok()?;
            answer["result"]["finished"]["result"]
                .as_str()
                .map(str::to_owned)
        })
}

/// The callback notice's outcome and result, as the coordinator's model was
/// given it (a message from troupe whose body is the notice's JSON).
fn callback_result(blocks: &[Value]) -> Option<(String, String)> {
    blocks.iter().find_map(|b| {
        let text = b["text"].as_str()?;
        let (head, notice) = text.split_once('\n')?;
        if !head.contains("from troupe") {
            return None;
        }
        let notice: Value = serde_json::from_str(notice).ok()?;
        Some((
            notice["outcome"].as_str()?.to_owned(),
            notice["result"].as_str()?.to_owned(),
        ))
    })
}

#[tokio::test]
async fn sandboxed_claude_code_workers_hand_their_results_to_a_direct_coordinator() {
    let upstream = Upstream::tcp(vec![]).await;
    let Some(Team {
        pair,
        ws,
        dir: _dir,
    }) = claude::team(&upstream.base_url(), KEY, MODEL, "results", &[]).await
    else {
        return;
    };
    upstream.script(
        COORDINATOR,
        vec![
            spawn("toolu_sync", SYNC_WORKER, "sync"),
            spawn("toolu_callback", CALLBACK_WORKER, "callback"),
            Turn::text("Waiting for the second worker."),
            Turn::text("Both answered."),
        ],
    );
    upstream.script(
        SYNC_WORKER,
        vec![finish(SYNC_RESULT), Turn::text("Finished.")],
    );
    upstream.script(
        CALLBACK_WORKER,
        vec![finish(CALLBACK_RESULT), Turn::text("Finished.")],
    );
    let root = pair
        .root(&ws, "claude", &format!("{COORDINATOR}: get two answers"))
        .await;

    // The coordinator's model saw both results.
    let deadline = tokio::time::Instant::now() + 3 * MINUTE;
    loop {
        let blocks = coordinator_blocks(&upstream);
        if let (Some(sync), Some(callback)) = (sync_result(&blocks), callback_result(&blocks)) {
            assert_eq!(sync, SYNC_RESULT);
            assert_eq!(callback, ("success".to_owned(), CALLBACK_RESULT.to_owned()));
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the coordinator never saw both results; its messages' blocks: {:#?}",
            blocks
                .iter()
                .filter(|b| b["type"] == "tool_result"
                    || b["text"].as_str().is_some_and(|t| t.starts_with("Message")))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Each worker ended completed with its result, and the coordinator is
    // still running: nobody was terminated.
    let children = pair.get(&root.session_id).await.children;
    assert_eq!(children.len(), 2, "{children:#?}");
    for child in &children {
        let want = if child.title == SYNC_WORKER {
            SYNC_RESULT
        } else {
            CALLBACK_RESULT
        };
        let got = pair
            .wait_status(&child.session_id, pb::SessionStatus::Completed)
            .await;
        let finished = got
            .result
            .clone()
            .and_then(|r| r.finished)
            .unwrap_or_else(|| panic!("no result: {got:#?}"));
        assert_eq!(finished.result, want);
        assert_eq!(child.trust_level(), pb::TrustLevel::Sandboxed);
    }
    let root_now = pair.get(&root.session_id).await.session.unwrap();
    assert_eq!(root_now.status(), pb::SessionStatus::Running);

    // No worker's model saw its direct parent's id.
    for request in upstream.requests() {
        if !first_message(&request.body).contains(COORDINATOR) {
            assert!(
                !request.body.to_string().contains(&root.session_id),
                "a sandboxed worker learned its parent's id: {request:#?}"
            );
        }
    }
    pair.terminate(&root.session_id).await;
}
