//! Processes of a workspace container: agents that use up their process
//! limits never keep another agent from starting within the container's
//! room, and a start refused, or failed, for want of processes says so.

use crate::common;

use std::time::Duration;

use common::{pair::*, *};
use tokio_stream::StreamExt;
use troupe_proto::{
    runner::{ExecState, ExitReason},
    session::{EventKind, SessionStatus, TerminateSessionRequest, session_event::Detail},
};
use troupe_runner_svc::admission::RESERVE;

/// Each agent's limit in these tests: the least the runner accepts.
const PER_EXEC: u64 = 16;

/// Forks until its uid (or the container) has no process left, then
/// stays, one process short of its limit.
const FILLER: &str = "(while :; do sleep 1001 & done) 2>/dev/null; echo full; exec sleep 1000";

/// How a session that ended without starting ended: its end reason and the
/// failed event's detail.
async fn failure(pair: &Pair, id: &str) -> (String, String) {
    let got = pair.wait_status(id, SessionStatus::Failed).await;
    let reason = got.session.unwrap().end_reason;
    let mut events = pair.watch(id).await;
    while let Ok(Some(Ok(event))) =
        tokio::time::timeout(Duration::from_secs(10), events.next()).await
    {
        if event.kind() == EventKind::Failed
            && let Some(Detail::Ended(end)) = event.detail
        {
            assert_eq!(end.reason, reason, "{end:?}");
            return (reason, end.detail);
        }
    }
    panic!("no failed event for {id}");
}

/// Waits until a filler holds its processes (or could not start at all).
async fn settled(pair: &Pair, id: &str) -> SessionStatus {
    let deadline = tokio::time::Instant::now() + MINUTE;
    loop {
        let got = pair.get(id).await;
        let status = got.session.as_ref().unwrap().status();
        let full = got
            .result
            .as_ref()
            .is_some_and(|r| r.output_tail.contains("full"));
        if (status == SessionStatus::Running && full) || status == SessionStatus::Failed {
            return status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{id} never settled: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Agents that fork up to their limits fill only their own room: the
/// container holds (limit - reserve) / per-agent limit of them, a start
/// beyond is refused with `no_resources` and a detail that names the
/// limits (never `killed`, never an exit code), and once one of them ends,
/// a new agent starts and forks.
#[tokio::test]
async fn agents_at_their_limits_never_keep_a_start_from_its_room() {
    // Room for three agents; five at their limits would fill it.
    let pair = Pair::start_on(
        |c| {
            c.pids_limit = (5 * PER_EXEC) as i64;
            c.exec_pids_limit = PER_EXEC;
        },
        |_| {},
    )
    .await;
    let capacity = ((5 * PER_EXEC - RESERVE) / PER_EXEC) as usize;
    assert_eq!(capacity, 3);
    let ws = pair.runner.workspace("room");
    pair.agent(&ws, "filler", FILLER);
    pair.agent(&ws, "worker", "echo $(echo alive)");

    let mut running = Vec::new();
    let mut refused = Vec::new();
    for _ in 0..5 {
        let id = pair.root(&ws, "filler", "fill").await.session_id;
        match settled(&pair, &id).await {
            SessionStatus::Running => running.push(id),
            _ => refused.push(id),
        }
    }
    assert_eq!(running.len(), capacity, "refused: {refused:?}");
    let worker = pair.root(&ws, "worker", "work").await.session_id;
    refused.push(worker);
    for id in &refused {
        let (reason, detail) = failure(&pair, id).await;
        assert_eq!(reason, "no_resources", "{id}: {detail}");
        assert!(
            detail.contains("--pids-limit") && detail.contains("already runs 3 agents"),
            "{detail}"
        );
    }

    // One ends: its room is free again, and a new agent starts and forks.
    let ended = running.pop().unwrap();
    pair.server
        .operator()
        .await
        .terminate_session(TerminateSessionRequest {
            session_id: ended.clone(),
            reason: String::new(),
        })
        .await
        .unwrap();
    let mut runner = pair.runner.client().await;
    let deadline = tokio::time::Instant::now() + MINUTE;
    while list_execs(&mut runner)
        .await
        .iter()
        .any(|e| e.exec_id == ended && e.state() == ExecState::Running)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{ended} never ended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let worker = pair.root(&ws, "worker", "work").await.session_id;
    let done = pair.wait_status(&worker, SessionStatus::Completed).await;
    assert_eq!(done.result.unwrap().output_tail, "alive\n");
}

/// The container has no process left, for processes the runner did not
/// count (here, its limit was lowered under it to what it runs): a start
/// fails with a reason that says so, never as an internal error, `killed`
/// or a bare exit code.
#[tokio::test]
async fn a_start_that_finds_no_process_left_says_so() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("nopids");
    runner.sh(&ws, "holder", "echo held; exec sleep 1000").await;
    let mut client = runner.client().await;
    let mut watch = client
        .watch_exec(troupe_proto::runner::WatchExecRequest {
            exec_id: "holder".into(),
            after_sequence: 0,
        })
        .await
        .unwrap()
        .into_inner();
    // Printed, then its shell became the sleep: what it runs stays as it is.
    while let Some(event) = tokio::time::timeout(MINUTE, watch.next()).await.unwrap() {
        if let Some(troupe_proto::runner::exec_event::Event::Output(out)) = event.unwrap().event
            && out.data.starts_with(b"held")
        {
            break;
        }
    }
    let docker = docker().await;
    let name = troupe_runner_svc::docker::Engine::container_name(&ws);
    let stats = docker
        .stats(
            &name,
            Some(bollard::query_parameters::StatsOptions {
                stream: false,
                one_shot: true,
            }),
        )
        .next()
        .await
        .unwrap()
        .unwrap();
    let current = stats.pids_stats.unwrap().current.unwrap();
    docker
        .update_container(
            &name,
            bollard::models::ContainerUpdateBody {
                pids_limit: Some(current as i64),
                ..Default::default()
            },
        )
        .await
        .unwrap();

    // `docker exec` fails (its own process is refused), or the supervisor
    // finds no process for its threads or its agent: which one varies
    // with how the engine makes the process. Either way, that reason.
    match client
        .start_exec(start_request(&ws, "victim", &["echo", "never"]))
        .await
    {
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
            assert!(
                status.message().contains("no process left")
                    && status
                        .message()
                        .contains(&format!("{current} of its {current}")),
                "{}",
                status.message()
            );
        }
        Ok(_) => {
            let out = collect(&mut client, "victim", 0, MINUTE).await;
            let (code, reason, detail) = out.exit.clone().unwrap();
            assert_eq!(reason, ExitReason::NoResources, "{code}: {detail}");
            assert!(detail.contains("process limit"), "{detail}");
            assert_eq!(out.stdout_text(), "");
        }
    }
}

/// The supervisor itself finds no process left for its agent (its uid
/// already runs as many as `--nproc` allows): it records the exit with
/// that reason, not as the agent's failure to start.
#[tokio::test]
async fn a_supervisor_that_finds_no_process_left_says_so() {
    use troupe_runner_svc::log;
    let runner = TestRunner::start().await;
    let ws = runner.workspace("nproc");
    let out = run_sh(&runner, &ws, "first", "echo hi").await;
    assert_eq!(out.stdout_text(), "hi\n");
    let meta: serde_json::Value = serde_json::from_slice(
        &std::fs::read(runner.config.state_dir().join("execs/first.json")).unwrap(),
    )
    .unwrap();
    let uid = meta["uid"].as_u64().unwrap();

    // The supervisor again, in the exec's directory and as its uid, allowed
    // one process: its own.
    let docker = docker().await;
    let name = troupe_runner_svc::docker::Engine::container_name(&ws);
    let cmd = [
        "/opt/troupe/bin/troupe-supervisor",
        "run",
        "--dir",
        "/run/troupe/execs/first",
        "--nproc",
        "1",
        "--",
        "echo",
        "never",
    ];
    let exec = docker
        .create_exec(
            &name,
            bollard::exec::CreateExecOptions::<String> {
                cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
                user: Some(format!("{uid}:{}", runner.config.uid_base)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    docker
        .start_exec(
            &exec.id,
            Some(bollard::exec::StartExecOptions {
                detach: true,
                ..Default::default()
            }),
        )
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + MINUTE;
    while docker.inspect_exec(&exec.id).await.unwrap().running == Some(true) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the supervisor hangs"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The log's last record is the supervisor's exit.
    let bytes = std::fs::read(runner.exec_dir(&ws, "first").join("output.log")).unwrap();
    let mut pos = 0;
    let mut last = None;
    while pos + log::HEADER_LEN <= bytes.len() {
        let header =
            log::decode_header(bytes[pos..pos + log::HEADER_LEN].try_into().unwrap()).unwrap();
        let start = pos + log::HEADER_LEN;
        last = Some((
            header.kind,
            bytes[start..start + header.len as usize].to_vec(),
        ));
        pos += header.record_len() as usize;
    }
    let (kind, payload) = last.unwrap();
    assert_eq!(kind, log::Kind::Exited);
    let exit = log::decode_exit(&payload).unwrap();
    assert_eq!(exit.reason, log::Reason::NoResources, "{exit:?}");
    assert!(exit.detail.contains("process limit"), "{exit:?}");
}
