//! Children return results: a sandboxed child of a direct parent, its agent
//! run by the real runner, finishes its task with FinishSession (its own
//! token, naming no session) and talks to its parent with ReplyToParent.
//! The parent gets the result from a SYNC create, in the CALLBACK notice and
//! from GetSession; the child's process is stopped after the grace, and its
//! exit then sends no second notice.

use crate::common;

use std::time::Duration;

use common::pair::*;
use troupe_proto::session::{
    self as pb, CreateSessionRequest, ExecutionMode, FinishSessionRequest, Outcome,
    ReplyToParentRequest, SessionStatus, TrustLevel,
};
use troupe_tests::{get, reason};

/// The parent echoes its stdin lines (so its output shows what it was
/// sent); the child runs until it is stopped.
fn agents(pair: &Pair, ws: &str) {
    pair.agent(
        ws,
        "parent",
        "while read -r line; do printf '%s\\n' \"$line\"; done",
    );
    pair.agent(ws, "worker", "sleep 1000");
}

fn sandboxed_child(mode: ExecutionMode) -> CreateSessionRequest {
    CreateSessionRequest {
        title: "worker".into(),
        agent_name: "worker".into(),
        initial_message: "work".into(),
        trust_level: TrustLevel::Sandboxed as i32,
        mode: mode as i32,
        ..Default::default()
    }
}

/// The running child of `parent` (its only child, once it runs).
async fn running_child(pair: &Pair, parent: &str) -> pb::Session {
    let deadline = tokio::time::Instant::now() + MINUTE;
    loop {
        let children = pair.get(parent).await.children;
        if let Some(child) = children
            .into_iter()
            .find(|c| c.status() == SessionStatus::Running)
        {
            return child;
        }
        assert!(tokio::time::Instant::now() < deadline, "no running child");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// In a workspace of its own, a running root `parent` and its running
/// sandboxed `worker` child, created in `mode`.
async fn parent_and_running_child(
    pair: &Pair,
    workspace: &str,
    mode: ExecutionMode,
) -> (pb::Session, pb::Session) {
    let ws = pair.runner.workspace(workspace);
    agents(pair, &ws);
    let root = pair.root(&ws, "parent", "start").await;
    pair.wait_status(&root.session_id, SessionStatus::Running)
        .await;
    let child = pair
        .server
        .act_as(&root.session_id)
        .await
        .create_session(sandboxed_child(mode))
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    pair.wait_status(&child.session_id, SessionStatus::Running)
        .await;
    (root, child)
}

/// The lines of the parent's stdin (as it echoed them) sent by `sender`.
async fn lines_from(pair: &Pair, parent: &str, sender: &str) -> Vec<serde_json::Value> {
    let tail = pair.get(parent).await.result.unwrap().output_tail;
    events(&tail)
        .into_iter()
        .filter(|line| line["sender"] == sender)
        .collect()
}

#[tokio::test]
async fn a_sandboxed_child_returns_its_result_to_its_direct_parent() {
    let pair = Pair::start_with(|c| {
        c.finish_grace_ms = 300;
        c.max_result_bytes = 64;
    })
    .await;
    let ws = pair.runner.workspace("results");
    agents(&pair, &ws);
    let root = pair.root(&ws, "parent", "start").await;
    pair.wait_status(&root.session_id, SessionStatus::Running)
        .await;

    // SYNC: the parent waits; the child replies, then finishes.
    let mut as_root = pair.server.act_as(&root.session_id).await;
    let request = sandboxed_child(ExecutionMode::Sync);
    let sync = tokio::spawn(async move { as_root.create_session(request).await });
    let child = running_child(&pair, &root.session_id).await;
    let mut as_child = pair.server.act_as(&child.session_id).await;

    // It never learns its direct parent's id.
    let own = as_child
        .get_session(get(&child.session_id))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(own.session.unwrap().parent_session_id, "");

    let reply = as_child
        .reply_to_parent(ReplyToParentRequest {
            message: "halfway there".into(),
            request_id: "r1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    // A retry with the same request id is the same message.
    let again = as_child
        .reply_to_parent(ReplyToParentRequest {
            message: "halfway there".into(),
            request_id: "r1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.message_id, reply.message_id);
    let sender = format!("session:{}", child.session_id);
    let deadline = tokio::time::Instant::now() + MINUTE;
    let heard = loop {
        let heard = lines_from(&pair, &root.session_id, &sender).await;
        if !heard.is_empty() || tokio::time::Instant::now() > deadline {
            break heard;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(heard.len(), 1, "once: {heard:?}");
    assert_eq!(heard[0]["message"], "halfway there");
    assert_eq!(heard[0]["sequence"], reply.sequence);
    // Only its parent: the child itself got no such line.
    assert_eq!(pair.get(&child.session_id).await.inbox_count, 1);

    // Over the limit: refused, naming it; nothing ended.
    let big = as_child
        .finish_session(FinishSessionRequest {
            result: "x".repeat(65),
            outcome: Outcome::Success as i32,
        })
        .await
        .unwrap_err();
    assert_eq!(big.code(), tonic::Code::InvalidArgument, "{big:?}");
    assert!(big.message().contains("limit of 64 bytes"), "{big:?}");
    assert_eq!(
        pair.get(&child.session_id).await.session.unwrap().status(),
        SessionStatus::Running
    );

    let finished = as_child
        .finish_session(FinishSessionRequest {
            result: "the answer is 42".into(),
            outcome: Outcome::Success as i32,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(finished.session.unwrap().end_reason, "finished");
    let sync = sync.await.unwrap().unwrap().into_inner();
    assert_eq!(sync.session.unwrap().status(), SessionStatus::Completed);
    let result = sync.result.unwrap().finished.expect("the child's result");
    assert_eq!(result.result, "the answer is 42");
    assert_eq!(result.outcome(), Outcome::Success);

    // Finishing twice is refused as a precondition, not as a bad token.
    let twice = as_child
        .finish_session(FinishSessionRequest {
            result: "again".into(),
            outcome: Outcome::Success as i32,
        })
        .await
        .unwrap_err();
    assert_eq!(twice.code(), tonic::Code::FailedPrecondition, "{twice:?}");
    assert_eq!(reason(&twice), "SESSION_ENDED");

    // GetSession shows it, and the process that did not exit is stopped
    // after the grace: its exit lands.
    let deadline = tokio::time::Instant::now() + MINUTE;
    let seen = loop {
        let seen = pair.get(&child.session_id).await;
        if seen.result.as_ref().unwrap().exit_code.is_some() {
            break seen;
        }
        assert!(tokio::time::Instant::now() < deadline, "never stopped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let seen = seen.result.unwrap();
    assert_eq!(seen.status(), SessionStatus::Completed);
    assert_eq!(seen.finished.unwrap().result, "the answer is 42");
}

/// The notice goes at the finish, with the result, while the process is
/// still in its grace (not at its exit).
#[tokio::test]
async fn the_callback_notice_carries_the_result_at_the_finish() {
    let pair = Pair::start_with(|c| c.finish_grace_ms = 600_000).await;
    let (root, second) =
        parent_and_running_child(&pair, "callbacks", ExecutionMode::Callback).await;
    let mut as_second = pair.server.act_as(&second.session_id).await;
    as_second
        .finish_session(FinishSessionRequest {
            result: "could not".into(),
            outcome: Outcome::Failure as i32,
        })
        .await
        .unwrap();
    let notice = pair.notice_of(&root.session_id, &second.session_id).await;
    assert_eq!(notice["status"], "failed", "{notice}");
    assert_eq!(notice["reason"], "finished", "{notice}");
    assert_eq!(notice["outcome"], "failure", "{notice}");
    assert_eq!(notice["result"], "could not", "{notice}");
    assert_eq!(notice["exit_code"], -1, "still in its grace: {notice}");
    let seen = pair.get(&second.session_id).await.result.unwrap();
    assert_eq!(seen.exit_code, None, "the grace is the service's: {seen:?}");
}

#[tokio::test]
async fn a_root_cannot_reply_and_the_operator_cannot_finish() {
    let pair = Pair::start().await;
    let ws = pair.runner.workspace("refusals");
    agents(&pair, &ws);
    let root = pair.root(&ws, "parent", "start").await;
    let mut as_root = pair.server.act_as(&root.session_id).await;
    let refused = as_root
        .reply_to_parent(ReplyToParentRequest {
            message: "anyone?".into(),
            request_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert_eq!(reason(&refused), "NO_PARENT");
    let mut operator = pair.server.operator().await;
    let refused = operator
        .finish_session(FinishSessionRequest::default())
        .await
        .unwrap_err();
    assert_eq!(reason(&refused), "SESSION_ONLY", "{refused:?}");
    let refused = operator
        .reply_to_parent(ReplyToParentRequest {
            message: "x".into(),
            request_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&refused), "SESSION_ONLY", "{refused:?}");
}

/// The stopped process's exit, after the grace, sends no second notice:
/// once the exit is recorded, a message sent to the parent afterwards is
/// echoed with exactly one notice of the child before it.
#[tokio::test]
async fn the_stopped_processs_exit_sends_no_second_notice() {
    let pair = Pair::start_with(|c| c.finish_grace_ms = 200).await;
    let (root, child) =
        parent_and_running_child(&pair, "one-notice", ExecutionMode::Callback).await;
    finish_done(&pair, &child.session_id).await;
    pair.notice_of(&root.session_id, &child.session_id).await;
    // The grace runs out: the process is stopped and its exit recorded.
    let deadline = tokio::time::Instant::now() + MINUTE;
    while pair
        .get(&child.session_id)
        .await
        .result
        .and_then(|r| r.exit_code)
        .is_none()
    {
        assert!(tokio::time::Instant::now() < deadline, "never stopped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pair.server
        .operator()
        .await
        .send_message(troupe_tests::message(&root.session_id, "after-the-exit"))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + MINUTE;
    while !lines_from(&pair, &root.session_id, "operator")
        .await
        .iter()
        .any(|l| l["message"] == "after-the-exit")
    {
        assert!(tokio::time::Instant::now() < deadline, "never delivered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let notices: Vec<_> = lines_from(&pair, &root.session_id, "troupe")
        .await
        .into_iter()
        .filter(|l| {
            l["message"]
                .as_str()
                .unwrap_or("")
                .contains(&child.session_id)
        })
        .collect();
    assert_eq!(notices.len(), 1, "{notices:#?}");
}

/// Finishes the session as itself: a success, with the result `done`.
async fn finish_done(pair: &Pair, id: &str) {
    pair.server
        .act_as(id)
        .await
        .finish_session(FinishSessionRequest {
            result: "done".into(),
            outcome: Outcome::Success as i32,
        })
        .await
        .unwrap();
}

/// The state of `exec_id` as the runner reports it.
async fn exec_state(pair: &Pair, exec_id: &str) -> troupe_proto::runner::ExecState {
    pair.runner
        .execs()
        .await
        .into_iter()
        .find(|e| e.exec_id == exec_id)
        .unwrap_or_else(|| panic!("the runner does not know {exec_id}"))
        .state()
}

/// A new owner (here the service restarted on its data) keeps a finished
/// session's process for the rest of its grace, while it stops an exec no
/// session knows at once; the process is stopped once the grace is over.
#[tokio::test]
async fn a_new_owner_keeps_the_finish_grace() {
    use troupe_proto::runner::ExecState;
    let mut pair = Pair::start_with(|c| c.finish_grace_ms = 20_000).await;
    let (_, child) = parent_and_running_child(&pair, "grace-takeover", ExecutionMode::Async).await;
    finish_done(&pair, &child.session_id).await;

    pair.server.stop_for_restart().await;
    pair.runner
        .sh(&child.workspace_id, "sess_stray_grace", "sleep 1006")
        .await;
    pair.server.start_again().await;
    // The new owner's reconcile has run once the stray exec is stopped.
    let deadline = tokio::time::Instant::now() + MINUTE;
    while exec_state(&pair, "sess_stray_grace").await != ExecState::Exited {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stray kept running"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        exec_state(&pair, &child.session_id).await,
        ExecState::Running,
        "the finished child was stopped before its grace was over"
    );
    // Its grace over, the process is stopped.
    let deadline = tokio::time::Instant::now() + MINUTE;
    while exec_state(&pair, &child.session_id).await != ExecState::Exited {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never stopped after its grace"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
