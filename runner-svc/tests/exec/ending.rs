//! How an exec ends: a timeout and a termination leave no process behind,
//! and the container going away ends it as lost.

use super::*;

#[tokio::test]
async fn timeout_and_terminate_leave_no_process_behind() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("term");
    let mut client = runner.client().await;

    // A timeout ends the exec and its children.
    let mut req = start_request(&ws, "slow", &["sh", "-c", "sleep 1001 & sleep 1000"]);
    req.timeout_ms = 300;
    client.start_exec(req).await.expect("start");
    let out = collect(&mut client, "slow", 0, MINUTE).await;
    assert_eq!(out.exit.as_ref().unwrap().1, ExitReason::TimedOut);

    // Terminate reaches a child that ignores SIGTERM and one that left the
    // process group with setsid.
    runner
        .sh(
            &ws,
            "stubborn",
            "trap '' TERM; setsid sleep 1002 & (trap '' TERM; sleep 1003) & echo ready; sleep 1004",
        )
        .await;
    wait_for_output(&mut client, "stubborn", "ready").await;
    let before = processes(&runner, &ws, "ps-1").await;
    for n in ["1002", "1003", "1004"] {
        assert!(before.contains(&format!("sleep {n}")), "{before}");
    }
    let reply = client
        .terminate_exec(TerminateExecRequest {
            exec_id: "stubborn".into(),
            grace_ms: 300,
        })
        .await
        .expect("terminate")
        .into_inner();
    let exec = reply.exec.unwrap();
    assert_eq!(exec.state(), ExecState::Exited);
    assert_eq!(exec.exit.unwrap().reason(), ExitReason::Killed);

    let after = processes(&runner, &ws, "ps-2").await;
    for n in ["1000", "1001", "1002", "1003", "1004"] {
        assert!(
            !after.contains(&format!("sleep {n}")),
            "left behind:\n{after}"
        );
    }
}

#[tokio::test]
async fn container_removed_under_a_running_exec() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("lost");
    let mut client = runner.client().await;
    runner.sh(&ws, "doomed", "echo up; sleep 1000").await;
    wait_for_output(&mut client, "doomed", "up").await;
    remove_container(&ws).await;
    let out = collect(&mut client, "doomed", 0, MINUTE).await;
    assert_eq!(out.exit.as_ref().unwrap().1, ExitReason::ContainerLost);

    // The next exec recreates the container.
    let out = run_sh(&runner, &ws, "after", "echo again").await;
    assert_eq!(out.stdout_text(), "again\n");
    assert_eq!(out.exit.unwrap().1, ExitReason::Exited);
}

/// Every process of the workspace container, as a fresh exec sees them.
async fn processes(runner: &TestRunner, ws: &str, exec_id: &str) -> String {
    run_sh(runner, ws, exec_id, "ps -o pid,user,args")
        .await
        .stdout_text()
}
