//! What an exec is given and gives back: its context as environment (never
//! on a command line), its output's bytes, streams and order, its exit,
//! and a stdin that stays open.

use super::*;

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
