//! Agents that attack their own supervisor, log and FIFOs: whatever they
//! do, the runner still ends them, reports truthfully and stays responsive.

use crate::common;

use std::time::Duration;

use common::*;
use troupe_proto::runner::{
    ExecState, ExitReason, ListExecsRequest, TerminateExecRequest, WatchExecRequest,
    WriteStdinRequest,
};

const MINUTE: Duration = Duration::from_secs(60);

async fn processes(runner: &TestRunner, ws: &str, exec_id: &str) -> String {
    run_sh(runner, ws, exec_id, "ps -o pid,user,args")
        .await
        .stdout_text()
}

#[tokio::test]
async fn stopping_the_supervisor_does_not_escape_the_timeout() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("stop");
    let mut req = start_request(&ws, "evil", &["sh", "-c", "kill -STOP $PPID; sleep 4321"]);
    req.timeout_ms = 500;
    let mut client = runner.client().await;
    client.start_exec(req).await.unwrap();
    let out = collect(&mut client, "evil", 0, MINUTE).await;
    assert_eq!(out.exit.unwrap().1, ExitReason::TimedOut);
    let left = processes(&runner, &ws, "ps").await;
    assert!(!left.contains("sleep 4321"), "{left}");
}

#[tokio::test]
async fn a_full_control_fifo_does_not_hang_terminate() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("fifo");
    runner
        .sh(
            &ws,
            "evil",
            "kill -STOP $PPID; head -c 70000 /dev/zero > $HOME/../control & sleep 4322",
        )
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut client = runner.client().await;
    let reply = tokio::time::timeout(
        Duration::from_secs(20),
        client.terminate_exec(TerminateExecRequest {
            exec_id: "evil".into(),
            grace_ms: 100,
        }),
    )
    .await
    .expect("terminate must not hang")
    .expect("terminate")
    .into_inner();
    let exec = reply.exec.unwrap();
    assert_eq!(exec.state(), ExecState::Exited);
    assert_eq!(exec.exit.unwrap().reason(), ExitReason::Killed);
    let left = processes(&runner, &ws, "ps").await;
    assert!(!left.contains("sleep 4322"), "{left}");
}

#[tokio::test]
async fn a_forged_exit_record_does_not_let_the_agent_live_on() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("forge");
    // An exit record (code 0, reason exited), then the supervisor killed.
    let script = r"sleep 4323 & printf '\004\005\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\001' >> $HOME/../output.log; kill -9 $PPID; wait";
    let mut client = runner.client().await;
    client
        .start_exec(start_request(&ws, "evil", &["sh", "-c", script]))
        .await
        .unwrap();
    let out = collect(&mut client, "evil", 0, MINUTE).await;
    assert!(out.exit.is_some());
    let left = processes(&runner, &ws, "ps").await;
    assert!(!left.contains("sleep 4323"), "{left}");
}

#[tokio::test]
async fn a_corrupt_log_ends_the_exec_and_says_so() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("corrupt");
    let mut client = runner.client().await;
    client
        .start_exec(start_request(
            &ws,
            "evil",
            &[
                "sh",
                "-c",
                "printf 'garbage-garbage' >> $HOME/../output.log; sleep 4324",
            ],
        ))
        .await
        .unwrap();
    let info = first_exit(&mut client).await;
    assert_eq!(info.reason(), ExitReason::Killed);
    assert!(info.detail.contains("corrupt"), "{}", info.detail);
    let left = processes(&runner, &ws, "ps").await;
    assert!(!left.contains("sleep 4324"), "{left}");
}

#[tokio::test]
async fn the_runner_stops_promptly_with_watchers_open() {
    let mut runner = TestRunner::start().await;
    let ws = runner.workspace("stopw");
    runner.sh(&ws, "w1", "echo hi; sleep 1000").await;
    let mut client = runner.client().await;
    let _stream = client
        .watch_exec(WatchExecRequest {
            exec_id: "w1".into(),
            after_sequence: 0,
        })
        .await
        .unwrap()
        .into_inner();
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::time::timeout(Duration::from_secs(15), runner.restart())
        .await
        .expect("the runner must stop with a watcher open");
    let mut client = runner.client().await;
    client
        .terminate_exec(TerminateExecRequest {
            exec_id: "w1".into(),
            grace_ms: 100,
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn exited_execs_are_forgotten_after_the_retention() {
    let runner = TestRunner::start_with(|c| c.keep_exited_secs = 1).await;
    let ws = runner.workspace("keep");
    let out = run_sh(&runner, &ws, "brief", "echo bye").await;
    assert_eq!(out.stdout_text(), "bye\n");
    let dir = runner.exec_dir(&ws, "brief");
    assert!(dir.exists());
    let mut client = runner.client().await;
    tokio::time::timeout(MINUTE, async {
        while !client
            .list_execs(ListExecsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .execs
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("the exec must be forgotten");
    assert!(!dir.exists(), "{} is still there", dir.display());
}

#[tokio::test]
async fn an_agent_that_truncates_its_log_is_ended_and_told_why() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("shrink");
    let mut client = runner.client().await;
    runner
        .sh(
            &ws,
            "evil",
            "echo hi; read x; : > $HOME/../output.log; sleep 4325",
        )
        .await;
    // Once the runner has read "hi", the agent empties its log.
    let mut stream = client
        .watch_exec(WatchExecRequest {
            exec_id: "evil".into(),
            after_sequence: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut seen = Collected::default();
    while seen.stdout_text() != "hi\n" {
        let event = tokio::time::timeout(MINUTE, tokio_stream::StreamExt::next(&mut stream))
            .await
            .expect("hi")
            .expect("open")
            .expect("event");
        seen.add(event);
    }
    client
        .write_stdin(WriteStdinRequest {
            exec_id: "evil".into(),
            data: b"go\n".to_vec(),
            close: false,
            ..Default::default()
        })
        .await
        .unwrap();
    let exit = first_exit(&mut client).await;
    assert_eq!(exit.reason(), ExitReason::Killed);
    assert!(exit.detail.contains("shrank"), "{}", exit.detail);
    let left = processes(&runner, &ws, "ps").await;
    assert!(!left.contains("sleep 4325"), "{left}");
}

#[tokio::test]
async fn records_an_agent_appends_to_its_log_itself_are_bounded_all_the_same() {
    let runner = TestRunner::start_with(|c| c.exec_log_max_mib = 1).await;
    let ws = runner.workspace("forger");
    // 800 well-formed stdout records of 64 KiB (50 MiB), written straight
    // into the log, past the supervisor and its window.
    let script = r"printf '\002\000\000\001\000\000\000\000\000\000\000\000\000' > $TMPDIR/rec; head -c 65536 /dev/zero >> $TMPDIR/rec; i=0; while [ $i -lt 800 ]; do cat $TMPDIR/rec >> $HOME/../output.log; i=$((i+1)); done; echo done";
    let log = runner.exec_dir(&ws, "evil").join("output.log");
    let mut client = runner.client().await;
    client
        .start_exec(start_request(&ws, "evil", &["sh", "-c", script]))
        .await
        .unwrap();
    let mut peak = 0;
    let exit = tokio::time::timeout(MINUTE, async {
        loop {
            peak = peak.max(allocated(&log));
            let execs = client
                .list_execs(ListExecsRequest::default())
                .await
                .unwrap()
                .into_inner()
                .execs;
            if let Some(exit) = execs.into_iter().find_map(|e| e.exit) {
                return exit;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the exec must end");
    assert_eq!(exit.reason(), ExitReason::Exited);
    assert!(std::fs::metadata(&log).unwrap().len() > 50 << 20);
    // The bound, and the two blocks at the log's ends, once the runner has
    // read what was appended last.
    let bound = (1 << 20) + 8192;
    let deadline = tokio::time::Instant::now() + MINUTE;
    let mut now = allocated(&log);
    while now > bound && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        now = allocated(&log);
    }
    assert!(now <= bound, "the log takes {now} bytes on disk");
    // Nothing holds such a writer back but the runner's reading.
    assert!(peak <= 8 << 20, "the log took {peak} bytes on disk");
    let out = collect(&mut client, "evil", 0, MINUTE).await;
    assert!(out.stdout_text().ends_with("done\n"));
}

/// Bytes the file takes on disk (its blocks, not its size).
fn allocated(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map_or(0, |m| m.blocks() * 512)
}

#[tokio::test]
async fn an_agent_inherits_no_descriptor_of_its_supervisor() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("fds");
    // The agent's own descriptors (the shell's, listed by a child that
    // opens none of its own there), then what each points at.
    let out = run_sh(&runner, &ws, "fds", "ls /proc/$$/fd; ls -l /proc/$$/fd >&2").await;
    let fds: Vec<String> = out
        .stdout_text()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(fds, ["0", "1", "2"], "{}", out.stderr_text());
}
