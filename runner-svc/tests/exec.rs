//! The runner against a real Docker engine: environment, output, exit,
//! stdin, timeout, termination, the container going away, limits, the
//! isolation of sessions, and restarts.

mod common;

use std::time::Duration;

use common::*;
use tonic::Code;
use troupe_proto::runner::{
    ExecState, ExitReason, ListExecsRequest, OutputStream, StartExecRequest, TerminateExecRequest,
    WriteStdinRequest, exec_event,
};

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn context_is_injected_as_environment_never_on_a_command_line() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("env");
    let mut req = start_request(
        &ws,
        "env-1",
        &[
            "sh",
            "-c",
            "env | sort; echo uid=$(id -u) gid=$(id -g); ps -o args",
        ],
    );
    req.env = [
        ("TROUPE_SESSION_ID", "env-1"),
        ("TROUPE_WORKSPACE_ID", ws.as_str()),
        ("TROUPE_TRUST_LEVEL", "sandboxed"),
        ("TROUPE_PARENT_SESSION_ID", "parent-9"),
        ("TROUPE_SESSION_TOKEN", "tok-secret-value"),
        (
            "TROUPE_SESSION_ENDPOINT",
            "unix:///run/troupe/session/session.sock",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    req.traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into();
    let mut client = runner.client().await;
    client.start_exec(req).await.expect("start");
    let out = collect(&mut client, "env-1", 0, MINUTE).await;
    let text = out.stdout_text();
    for line in [
        "TROUPE_SESSION_ID=env-1",
        &format!("TROUPE_WORKSPACE_ID={ws}"),
        "TROUPE_TRUST_LEVEL=sandboxed",
        "TROUPE_PARENT_SESSION_ID=parent-9",
        "TROUPE_SESSION_TOKEN=tok-secret-value",
        "PARACHUTE_SESSION_ID=env-1",
        &format!("PARACHUTE_WORKSPACE_ID={ws}"),
        "PARACHUTE_TRUST_LEVEL=sandboxed",
        "TRACEPARENT=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "HOME=/run/troupe/execs/env-1/home",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    let uid = runner.config.uid_base + 1;
    assert!(
        text.contains(&format!("uid={uid} gid={}", runner.config.uid_base)),
        "{text}"
    );
    // `ps -o args` lists every command line the agent can see: none holds the token.
    let args: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("COMMAND"))
        .collect();
    assert!(args.len() > 1, "ps printed nothing:\n{text}");
    assert!(
        args.iter().all(|l| !l.contains("tok-secret-value")),
        "token on a command line: {args:?}"
    );
    assert_eq!(out.exit, Some((0, ExitReason::Exited, String::new())));
}

#[tokio::test]
async fn output_keeps_bytes_streams_order_and_sequence() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("bytes");
    // NUL, invalid UTF-8, an escape sequence, then stderr, then stdout again.
    let script = r"printf 'a\000b\377c\033[31mred\033[0m\n'; sleep 0.2; printf 'err\000\n' >&2; sleep 0.2; printf 'tail'";
    let out = run_sh(&runner, &ws, "bytes-1", script).await;
    assert_eq!(
        out.chunks,
        vec![
            (
                OutputStream::Stdout,
                b"a\0b\xffc\x1b[31mred\x1b[0m\n".to_vec()
            ),
            (OutputStream::Stderr, b"err\0\n".to_vec()),
            (OutputStream::Stdout, b"tail".to_vec()),
        ]
    );
    let sequences: Vec<u64> = out.events.iter().map(|e| e.sequence).collect();
    let expected: Vec<u64> = (1..=out.events.len() as u64).collect();
    assert_eq!(sequences, expected);
    assert!(matches!(
        out.events.first().and_then(|e| e.event.as_ref()),
        Some(exec_event::Event::Started(s)) if s.pid > 0 && !s.container_id.is_empty()
    ));
    assert!(matches!(
        out.events.last().and_then(|e| e.event.as_ref()),
        Some(exec_event::Event::Exited(_))
    ));

    // A watcher resuming after any sequence gets exactly the rest.
    let mut client = runner.client().await;
    for after in 0..out.events.len() as u64 {
        let rest = collect(&mut client, "bytes-1", after, MINUTE).await;
        assert_eq!(rest.events, out.events[after as usize..].to_vec());
    }
    let status = client
        .watch_exec(troupe_proto::runner::WatchExecRequest {
            exec_id: "bytes-1".into(),
            after_sequence: out.events.len() as u64 + 1,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange);
}

#[tokio::test]
async fn exit_codes_and_reasons() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("exit");
    let out = run_sh(&runner, &ws, "exit-3", "exit 3").await;
    assert_eq!(out.exit, Some((3, ExitReason::Exited, String::new())));

    let out = run_sh(&runner, &ws, "exit-sig", "kill -9 $$").await;
    let (code, reason, detail) = out.exit.unwrap();
    assert_eq!((code, reason), (137, ExitReason::Exited));
    assert!(detail.contains("signal 9"), "{detail}");

    let mut client = runner.client().await;
    client
        .start_exec(start_request(&ws, "missing", &["/no/such/program"]))
        .await
        .expect("start");
    let out = collect(&mut client, "missing", 0, MINUTE).await;
    let (code, reason, detail) = out.exit.unwrap();
    assert_eq!((code, reason), (127, ExitReason::Exited));
    assert!(detail.contains("/no/such/program"), "{detail}");

    let info = client
        .list_execs(ListExecsRequest {
            workspace_id: ws.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.execs.len(), 3);
    assert!(info.execs.iter().all(|e| e.state() == ExecState::Exited));
}

#[tokio::test]
async fn stdin_stays_open_for_later_writes() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("stdin");
    let mut client = runner.client().await;
    let mut req = start_request(&ws, "cat-1", &["cat"]);
    req.initial_stdin = b"{\"message\":\"first\"}\n".to_vec();
    client.start_exec(req).await.expect("start");
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    for data in [b"second\n".to_vec(), big.clone()] {
        client
            .write_stdin(WriteStdinRequest {
                exec_id: "cat-1".into(),
                data,
                close: false,
                ..Default::default()
            })
            .await
            .expect("write");
    }
    client
        .write_stdin(WriteStdinRequest {
            exec_id: "cat-1".into(),
            data: b"last".to_vec(),
            close: true,
            ..Default::default()
        })
        .await
        .expect("close");
    let out = collect(&mut client, "cat-1", 0, MINUTE).await;
    let mut expected = b"{\"message\":\"first\"}\nsecond\n".to_vec();
    expected.extend_from_slice(&big);
    expected.extend_from_slice(b"last");
    assert_eq!(out.stdout.len(), expected.len());
    assert!(out.stdout == expected, "stdin bytes differ");
    assert_eq!(out.exit, Some((0, ExitReason::Exited, String::new())));

    let status = client
        .write_stdin(WriteStdinRequest {
            exec_id: "cat-1".into(),
            data: b"late".to_vec(),
            close: false,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
}

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

#[tokio::test]
async fn fork_bomb_is_contained_while_other_execs_work() {
    let runner = TestRunner::start_with(|c| {
        c.pids_limit = 200;
        c.exec_pids_limit = 40;
    })
    .await;
    let ws = runner.workspace("bomb");
    let mut client = runner.client().await;
    runner
        .sh(
            &ws,
            "ticker",
            "i=0; while [ $i -lt 1000 ]; do echo tick$i; i=$((i+1)); sleep 0.1; done",
        )
        .await;
    wait_for_output(&mut client, "ticker", "tick1").await;
    runner
        .sh(&ws, "bomb", "b() { b | b & }; b; sleep 1000")
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Another agent still starts, runs and forks.
    let out = run_sh(&runner, &ws, "neighbour", "echo $(echo alive)").await;
    assert_eq!(out.stdout_text(), "alive\n");
    let before = last_tick(&runner, "ticker").await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let after = last_tick(&runner, "ticker").await;
    assert!(after > before, "the ticker stalled at {before} ({after})");

    let reply = client
        .terminate_exec(TerminateExecRequest {
            exec_id: "bomb".into(),
            grace_ms: 100,
        })
        .await
        .expect("terminate bomb")
        .into_inner();
    assert_eq!(reply.exec.unwrap().state(), ExecState::Exited);
    let inspect = docker()
        .await
        .inspect_container(
            &troupe_runner_svc::docker::Engine::container_name(&ws),
            None,
        )
        .await
        .unwrap();
    assert_eq!(inspect.host_config.unwrap().pids_limit, Some(200));
}

#[tokio::test]
async fn a_sibling_cannot_read_another_sessions_token_or_files() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("iso");
    let mut client = runner.client().await;
    let mut req = start_request(
        &ws,
        "victim",
        &[
            "sh",
            "-c",
            "echo $$ > /workspace/victim.pid; echo ready; sleep 1000",
        ],
    );
    req.env
        .insert("TROUPE_SESSION_TOKEN".into(), "tok-victim-secret".into());
    client.start_exec(req).await.expect("start victim");
    wait_for_output(&mut client, "victim", "ready").await;

    // The victim itself can read its environment: the probe below would see it.
    let own = run_sh(
        &runner,
        &ws,
        "victim-self",
        "cat /proc/self/environ | tr '\\0' '\\n' | grep -c TROUPE_",
    )
    .await;
    assert_ne!(own.stdout_text().trim(), "0");

    let attack = "pid=$(cat /workspace/victim.pid); \
        cat /proc/$pid/environ; echo environ=$?; \
        tr '\\0' '\\n' < /proc/$pid/environ; \
        ls /run/troupe/execs; echo list=$?; \
        cat /run/troupe/execs/victim/output.log; echo log=$?; \
        echo x > /run/troupe/execs/victim/stdin; echo stdin=$?; \
        kill -9 $pid; echo kill=$?";
    let out = run_sh(&runner, &ws, "attacker", attack).await;
    let all = format!("{}{}", out.stdout_text(), out.stderr_text());
    assert!(!all.contains("tok-victim-secret"), "token leaked:\n{all}");
    for step in ["environ", "list", "log", "stdin", "kill"] {
        let text = out.stdout_text();
        assert!(
            text.contains(&format!("{step}=")),
            "{step} did not run:\n{all}"
        );
        assert!(
            !text.contains(&format!("{step}=0")),
            "{step} succeeded:\n{all}"
        );
    }
    let victim = client
        .list_execs(ListExecsRequest {
            workspace_id: ws.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .execs
        .into_iter()
        .find(|e| e.exec_id == "victim")
        .unwrap();
    assert_eq!(victim.state(), ExecState::Running);
}

#[tokio::test]
async fn runner_restart_loses_no_output_and_keeps_stdin() {
    let mut runner = TestRunner::start().await;
    let ws = runner.workspace("restart");
    let mut client = runner.client().await;
    runner
        .sh(
            &ws,
            "counter",
            "i=1; while [ $i -le 60 ]; do echo line $i; i=$((i+1)); sleep 0.05; done",
        )
        .await;
    client
        .start_exec(start_request(&ws, "echoer", &["cat"]))
        .await
        .expect("start cat");
    client
        .write_stdin(WriteStdinRequest {
            exec_id: "echoer".into(),
            data: b"before ".to_vec(),
            close: false,
            ..Default::default()
        })
        .await
        .unwrap();

    // Read a few events, then restart the runner mid-stream.
    let mut seen = Collected::default();
    {
        let mut stream = client
            .watch_exec(troupe_proto::runner::WatchExecRequest {
                exec_id: "counter".into(),
                after_sequence: 0,
            })
            .await
            .unwrap()
            .into_inner();
        while seen.events.len() < 5 {
            let event = tokio_stream::StreamExt::next(&mut stream)
                .await
                .unwrap()
                .unwrap();
            seen.add(event);
        }
    }
    runner.restart().await;
    let mut client = runner.client().await;
    let last = seen.events.last().unwrap().sequence;
    let rest = collect(&mut client, "counter", last, MINUTE).await;
    for event in rest.events {
        seen.add(event);
    }
    let expected: String = (1..=60).map(|i| format!("line {i}\n")).collect();
    assert_eq!(seen.stdout_text(), expected);
    let sequences: Vec<u64> = seen.events.iter().map(|e| e.sequence).collect();
    assert_eq!(
        sequences,
        (1..=seen.events.len() as u64).collect::<Vec<_>>()
    );

    client
        .write_stdin(WriteStdinRequest {
            exec_id: "echoer".into(),
            data: b"after".to_vec(),
            close: true,
            ..Default::default()
        })
        .await
        .expect("stdin after restart");
    let out = collect(&mut client, "echoer", 0, MINUTE).await;
    assert_eq!(out.stdout_text(), "before after");
    assert_eq!(out.exit.unwrap().1, ExitReason::Exited);
}

#[tokio::test]
async fn a_hundred_megabytes_arrive_intact_and_a_slow_watcher_holds_the_agent_back() {
    let runner = TestRunner::start_with(|c| c.output_window_kib = 4096).await;
    let ws = runner.workspace("big");
    let script = "head -c 104857600 /dev/urandom > $TMPDIR/big; sha256sum $TMPDIR/big >&2; cat $TMPDIR/big; rm $TMPDIR/big";
    runner.sh(&ws, "big", script).await;

    // Nobody watches yet: the log stops growing near the window.
    let log = runner.exec_dir(&ws, "big").join("output.log");
    let mut size = 0;
    for _ in 0..300 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = std::fs::metadata(&log).unwrap().len();
        if now == size && now > 1 << 20 {
            break;
        }
        size = now;
    }
    let size = std::fs::metadata(&log).unwrap().len();
    assert!(
        size > 1 << 20 && size < (4 << 20) + (1 << 20),
        "log at {size} bytes while nobody watches"
    );

    let mut client = runner.client().await;
    let out = collect(&mut client, "big", 0, MINUTE * 3).await;
    assert_eq!(out.stdout.len(), 104_857_600);
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&out.stdout));
    assert_eq!(
        out.stderr_text().split_whitespace().next(),
        Some(digest.as_str())
    );
    assert_eq!(out.exit.unwrap().1, ExitReason::Exited);
}

#[tokio::test]
async fn bad_requests_are_refused() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("bad");
    let mut client = runner.client().await;
    let cases: Vec<(StartExecRequest, Code)> = vec![
        (start_request(&ws, "../x", &["true"]), Code::InvalidArgument),
        (
            start_request("../etc", "x1", &["true"]),
            Code::InvalidArgument,
        ),
        (start_request(&ws, "x2", &[]), Code::InvalidArgument),
        (
            {
                let mut r = start_request(&ws, "x3", &["true"]);
                r.env.insert("A=B".into(), "c".into());
                r
            },
            Code::InvalidArgument,
        ),
    ];
    for (req, code) in cases {
        let status = client.start_exec(req.clone()).await.unwrap_err();
        assert_eq!(status.code(), code, "{req:?}: {status:?}");
    }
    runner.sh(&ws, "once", "true").await;
    let status = client
        .start_exec(start_request(&ws, "once", &["true"]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists);
    let status = client
        .write_stdin(WriteStdinRequest {
            exec_id: "nope".into(),
            data: vec![],
            close: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);

    // Without the operator token nothing runs.
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", runner.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut anonymous =
        troupe_proto::runner::runner_service_client::RunnerServiceClient::new(channel);
    let status = anonymous
        .start_exec(start_request(&ws, "anon", &["true"]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
}

/// Every process of the workspace container, as a fresh exec sees them.
async fn processes(runner: &TestRunner, ws: &str, exec_id: &str) -> String {
    run_sh(runner, ws, exec_id, "ps -o pid,user,args")
        .await
        .stdout_text()
}

async fn last_tick(runner: &TestRunner, exec_id: &str) -> u32 {
    let mut client = runner.client().await;
    // Everything printed so far: the events up to the current last sequence.
    let last = client
        .list_execs(ListExecsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .execs
        .into_iter()
        .find(|e| e.exec_id == exec_id)
        .unwrap()
        .last_sequence;
    let mut stream = client
        .watch_exec(troupe_proto::runner::WatchExecRequest {
            exec_id: exec_id.into(),
            after_sequence: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut seen = Collected::default();
    while seen.events.last().is_none_or(|e| e.sequence < last) {
        let event = tokio_stream::StreamExt::next(&mut stream).await.unwrap();
        seen.add(event.unwrap());
    }
    seen.stdout_text()
        .lines()
        .filter_map(|l| l.strip_prefix("tick")?.parse().ok())
        .max()
        .unwrap_or(0)
}

#[tokio::test]
async fn a_missing_image_is_named_in_the_error() {
    let runner = TestRunner::start_with(|c| c.image = "troupe-no-such-image:none".into()).await;
    let ws = runner.workspace("noimage");
    let status = runner
        .client()
        .await
        .start_exec(start_request(&ws, "x", &["true"]))
        .await
        .unwrap_err();
    assert!(
        status.message().contains("troupe-no-such-image:none")
            && status.message().contains("scripts/build-image"),
        "{status:?}"
    );
}
