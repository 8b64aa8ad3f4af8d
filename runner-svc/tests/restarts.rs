//! Restarts and outages of either side of the pair, both real: a session
//! service restart loses no output and reconciles what ran meanwhile; starts
//! made while the runner is down are retried, given up once their session
//! ended, and made after a restart; children that ended before they started
//! are reported to their parent.

use crate::common;

use std::time::Duration;

use common::pair::*;
use troupe_proto::session::{
    self as pb, CreateSessionRequest, ExecutionMode, SessionStatus, TerminateSessionRequest,
};

#[tokio::test]
async fn a_session_service_restart_loses_no_output_and_reconciles() {
    let mut pair = Pair::start().await;
    let ws = pair.runner.workspace("restart");
    pair.agent(
        &ws,
        "counter",
        "i=1; while [ $i -le 40 ]; do echo line $i; i=$((i+1)); sleep 0.05; done",
    );
    pair.agent(&ws, "sleeper", "sleep 1004");
    let counting = pair.root(&ws, "counter", "go").await;
    let sleeping = pair.root(&ws, "sleeper", "go").await;
    pair.wait_status(&counting.session_id, SessionStatus::Running)
        .await;
    pair.wait_status(&sleeping.session_id, SessionStatus::Running)
        .await;

    pair.server.stop_for_restart().await;
    // While the session service is down: one agent keeps printing, another
    // is ended behind its back, and an exec no session knows appears.
    let mut runner = pair.runner.client().await;
    runner
        .terminate_exec(troupe_proto::runner::TerminateExecRequest {
            exec_id: sleeping.session_id.clone(),
            grace_ms: 100,
        })
        .await
        .unwrap();
    pair.runner.sh(&ws, "sess_stray", "sleep 1005").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    pair.server.start_again().await;

    let done = pair
        .wait_status(&counting.session_id, SessionStatus::Completed)
        .await;
    let expected: String = (1..=40).map(|i| format!("line {i}\n")).collect();
    assert_eq!(done.result.unwrap().output_tail, expected);

    let lost = pair
        .wait_status(&sleeping.session_id, SessionStatus::Failed)
        .await;
    assert_eq!(lost.session.unwrap().end_reason, "killed");

    let deadline = tokio::time::Instant::now() + MINUTE;
    loop {
        let stray = common::list_execs(&mut runner)
            .await
            .into_iter()
            .find(|e| e.exec_id == "sess_stray")
            .unwrap();
        if stray.state() == troupe_proto::runner::ExecState::Exited {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stray exec kept running"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let audit = pair
        .server
        .operator()
        .await
        .list_audit(pb::ListAuditRequest {
            session_id: "sess_stray".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert!(audit.iter().any(|e| e.action == "reconcile"), "{audit:?}");
}

/// A session created while the runner is down stays pending while its start
/// is retried; ended before the runner is back, its agent never runs.
#[tokio::test]
async fn a_start_retried_while_the_runner_is_down_gives_up_once_the_session_ended() {
    let mut pair = Pair::start().await;
    let ws = pair.runner.workspace("retry");
    pair.agent(&ws, "holder", "sleep 1000");
    pair.runner.stop().await;
    let root = pair.root(&ws, "holder", "hold").await;
    // The driver's first attempts meet no runner.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        pair.get(&root.session_id).await.session.unwrap().status(),
        SessionStatus::Pending
    );
    pair.server
        .operator()
        .await
        .terminate_session(TerminateSessionRequest {
            session_id: root.session_id.clone(),
            reason: String::new(),
        })
        .await
        .unwrap();
    pair.runner.start_again().await;
    // Longer than the driver's pause between attempts: the next one has
    // found the session ended by now.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let execs = pair.runner.execs().await;
    assert!(
        execs.iter().all(|e| e.exec_id != root.session_id),
        "{execs:?}"
    );
    assert_eq!(
        pair.get(&root.session_id).await.session.unwrap().status(),
        SessionStatus::Terminated
    );
}

/// Children ended before their agents could start (the runner was down):
/// a SYNC create returns, a CALLBACK parent is told, and that notice, sent
/// while the runner could not write it, reaches the running parent once the
/// runner is back.
#[tokio::test]
async fn children_ended_before_they_started_are_reported_to_their_parent() {
    let mut pair = Pair::start().await;
    let ws = pair.runner.workspace("unstarted");
    pair.agent(
        &ws,
        "parent",
        "while read -r line; do printf '%s\\n' \"$line\"; done",
    );
    pair.agent(&ws, "holder", "sleep 1000");
    let root = pair.root(&ws, "parent", "start").await;
    pair.wait_status(&root.session_id, SessionStatus::Running)
        .await;
    pair.runner.stop().await;

    let called = pair
        .child(&root.session_id, "holder", ExecutionMode::Callback)
        .await
        .session
        .unwrap()
        .session_id;
    let mut op = pair.server.operator().await;
    let root_id = root.session_id.clone();
    let waiting = tokio::spawn(async move {
        op.create_session(CreateSessionRequest {
            title: "waited".into(),
            agent_name: "holder".into(),
            parent_session_id: root_id,
            mode: ExecutionMode::Sync as i32,
            ..Default::default()
        })
        .await
    });
    // Both children wait for the runner, pending.
    let deadline = tokio::time::Instant::now() + MINUTE;
    let synced = loop {
        let children = pair.get(&root.session_id).await.children;
        if let Some(waited) = children.iter().find(|c| c.title == "waited") {
            break waited.session_id.clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "{children:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for id in [&called, &synced] {
        assert_eq!(
            pair.get(id).await.session.unwrap().status(),
            SessionStatus::Pending
        );
        pair.server
            .operator()
            .await
            .terminate_session(TerminateSessionRequest {
                session_id: id.clone(),
                reason: String::new(),
            })
            .await
            .unwrap();
    }
    let answered = tokio::time::timeout(MINUTE, waiting)
        .await
        .expect("the SYNC create returns once its child ended")
        .unwrap()
        .expect("created")
        .into_inner();
    assert_eq!(
        answered.session.unwrap().status(),
        SessionStatus::Terminated
    );

    // The notice is stored while the runner is still down: it cannot be
    // written to the parent's stdin yet.
    let deadline = tokio::time::Instant::now() + MINUTE;
    while pair.get(&root.session_id).await.inbox_count < 2 {
        assert!(tokio::time::Instant::now() < deadline, "no notice stored");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pair.runner.start_again().await;
    let notice = pair.notice_of(&root.session_id, &called).await;
    assert_eq!(notice["type"], "session_ended", "{notice}");
    assert_eq!(notice["status"], "terminated", "{notice}");
    assert_eq!(notice["reason"], "not_started", "{notice}");
    // One notice, however the end was seen.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let tail = pair.get(&root.session_id).await.result.unwrap().output_tail;
    assert_eq!(tail.matches(called.as_str()).count(), 1, "{tail}");
}

/// A session whose start was still being retried (the runner down) when the
/// session service restarted is started once both are back, not failed.
#[tokio::test]
async fn a_start_pending_across_a_restart_is_made_afterwards() {
    let mut pair = Pair::start().await;
    let ws = pair.runner.workspace("late");
    pair.agent(&ws, "greeter", "read m; echo \"late: $m\"");
    pair.runner.stop().await;
    let root = pair.root(&ws, "greeter", "hello").await;
    // The driver's first attempts meet no runner.
    tokio::time::sleep(Duration::from_secs(1)).await;
    pair.server.stop_for_restart().await;
    pair.runner.start_again().await;
    pair.server.start_again().await;
    let done = pair
        .wait_status(&root.session_id, SessionStatus::Completed)
        .await;
    assert!(
        done.result.unwrap().output_tail.contains("late: "),
        "the agent ran and read its message"
    );
}
