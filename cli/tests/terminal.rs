//! What an agent writes reaches the operator's terminal only escaped: the
//! `troupe` binary's text and JSON carry no escape sequence, bell, carriage
//! return, C1 or bidi control, whatever an agent put in its title, output,
//! exit detail, progress or termination reason; `session get --raw` alone
//! writes the output as it was.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use troupe_proto::session::{
    CreateRootSessionRequest, ReportProgressRequest, TerminateSessionRequest, TrustLevel,
};
use troupe_session_svc::{
    model::{ExitReason, ProcessChange, ProcessExit},
    store::{Holder, SqliteStore, prelude::*},
};
use troupe_tests::{OPERATOR_TOKEN, TestServer, child, create_child};

const TROUPE: &str = env!("CARGO_BIN_EXE_troupe");

/// Retitles the window (OSC 0, ended by BEL), clears the screen, returns the
/// carriage, starts an 8-bit CSI, reverses the line, deletes; and a newline
/// that would forge a line of its own.
const HOSTILE: &str = "A\x1b]0;owned\x07B\x1b[2J\rC\u{9b}31mD\u{202e}E\u{7f}\nforged";

/// The CLI, pointed at `server`, printing text.
fn troupe(server: &TestServer, data: &std::path::Path) -> Command {
    let mut command = Command::new(TROUPE);
    command
        .env("TROUPE_ENDPOINT", format!("http://{}", server.addr))
        .env("TROUPE_OPERATOR_TOKEN", OPERATOR_TOKEN)
        .env("TROUPE_DATA_DIR", data)
        .env_remove("TROUPE_TOKEN")
        .env_remove("TROUPE_RAW");
    command
}

/// Runs `troupe <args>` to its end; returns its stdout, after checking it succeeded.
async fn stdout(mut command: Command, args: &[&str]) -> Vec<u8> {
    command.args(args);
    let output = tokio::task::spawn_blocking(move || command.output().expect("troupe runs"))
        .await
        .expect("joined");
    assert!(
        output.status.success(),
        "troupe {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// Fails unless `bytes` are UTF-8 holding no control character but newline
/// (and JSON's indentation), and no bidi control; returns them as text.
fn terminal_safe(what: &str, bytes: &[u8]) -> String {
    let text = std::str::from_utf8(bytes)
        .unwrap_or_else(|e| panic!("{what}: not UTF-8 ({e}): {bytes:?}"))
        .to_owned();
    let bad: Vec<char> = text
        .chars()
        .filter(|&c| {
            (c.is_control() && c != '\n')
                || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect();
    assert!(bad.is_empty(), "{what} printed {bad:?} raw:\n{text}");
    text
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_written_text_reaches_the_terminal_escaped() {
    let mut server = TestServer::start().await;
    let data = tempfile::tempdir().expect("dir");

    // An agent's title, a child's, its progress and a termination reason.
    let created = server
        .operator()
        .await
        .create_root_session(CreateRootSessionRequest {
            workspace_id: "alpha".into(),
            trust_level: TrustLevel::Direct as i32,
            title: HOSTILE.into(),
            agent_name: "worker".into(),
            initial_message: "go".into(),
            request_id: String::new(),
            budget: None,
            writable_paths: Vec::new(),
        })
        .await
        .expect("create root")
        .into_inner();
    let root = created.session.expect("session");
    let mut as_root = server.client(Some(&created.session_token)).await;
    let kid = create_child(&mut as_root, child(HOSTILE)).await;
    as_root
        .report_progress(ReportProgressRequest {
            progress: 50,
            description: HOSTILE.into(),
        })
        .await
        .expect("progress");
    as_root
        .terminate_session(TerminateSessionRequest {
            session_id: kid.session_id.clone(),
            reason: HOSTILE.into(),
        })
        .await
        .expect("terminate");

    // The agent's output and exit, as the runner's events record them; its
    // output is not even UTF-8.
    server.stop_for_restart().await;
    let store = SqliteStore::open(&server.config.database_url())
        .await
        .expect("open store");
    // The runner's reports are the lease holder's to write.
    let fence = store
        .acquire_lease(&Holder::generate(), Duration::from_secs(60))
        .await
        .expect("acquire the lease")
        .expect("the lease is free once the service stopped");
    let mut output = HOSTILE.as_bytes().to_vec();
    output.extend_from_slice(b"\xff\xfe\x1b[31m red \xc3\n");
    let exit = ProcessExit {
        code: 3,
        reason: ExitReason::Exited,
        detail: HOSTILE.into(),
    };
    for (seq, change) in [
        ProcessChange::Started,
        ProcessChange::Output {
            stream: "stdout",
            data: output.clone(),
        },
        ProcessChange::Exited(exit),
    ]
    .into_iter()
    .enumerate()
    {
        store
            .record_process(
                &fence,
                &root.session_id.as_str().into(),
                seq as u64 + 1,
                change,
                16 * 1024,
            )
            .await
            .expect("record");
    }
    drop(store);
    server.start_again().await;
    let cli = || troupe(&server, data.path());

    let id = root.session_id.as_str();
    let kid_id = kid.session_id.as_str();
    let get = terminal_safe("get", &stdout(cli(), &["session", "get", id]).await);
    assert!(get.contains(r"A\u{1b}]0;owned\u{7}B\u{1b}[2J\rC\u{9b}31mD\u{202e}E\u{7f}\nforged"));
    assert!(get.contains("\u{fffd}"), "the output's bad bytes: {get}");
    let got_kid = terminal_safe(
        "get child",
        &stdout(cli(), &["session", "get", kid_id]).await,
    );
    assert!(got_kid.contains(r"\u{1b}]0;owned"), "{got_kid}");
    let list = terminal_safe(
        "list",
        &stdout(cli(), &["session", "list", "--workspace", "alpha", "--all"]).await,
    );
    assert_eq!(list.lines().count(), 3, "a header and two sessions: {list}");
    let tree = terminal_safe("tree", &stdout(cli(), &["session", "tree", id]).await);
    assert_eq!(tree.lines().count(), 2, "two sessions: {tree}");
    terminal_safe("audit", &stdout(cli(), &["audit"]).await);

    // Every event, through to the end of the root's process.
    let watch = watch_until_failed(cli(), &root.tree_id, &[]).await;
    let watch = terminal_safe("watch", &watch);
    for kind in ["created", "progress", "terminated", "output", "failed"] {
        assert!(
            watch
                .lines()
                .any(|l| l.split(' ').nth(1) == Some(kind) && l.contains(r"\u{1b}]0;owned")),
            "the {kind} event, escaped: {watch}"
        );
    }

    // JSON escapes them too, and reads back to the same text.
    for args in [
        &["--json", "session", "get", id][..],
        &["--json", "session", "list", "--workspace", "alpha", "--all"],
        &["--json", "session", "tree", id],
    ] {
        let json = terminal_safe("json", &stdout(cli(), args).await);
        let value: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        assert!(json.contains(r"\u009b"), "{args:?}: {json}");
        assert!(value.to_string().contains('\u{9b}'), "{args:?}: {value}");
    }
    terminal_safe("audit --json", &stdout(cli(), &["--json", "audit"]).await);
    let watch = watch_until_failed(cli(), &root.tree_id, &["--json"]).await;
    let watch = terminal_safe("watch --json", &watch);
    assert_eq!(
        watch.matches(r"\u009b").count(),
        6,
        "every event's text: {watch}"
    );

    // The operator who asks for the bytes gets the output as the service
    // keeps it: everything the agent wrote, with its bytes that are not
    // UTF-8 replaced.
    let raw = stdout(cli(), &["session", "get", id, "--raw"]).await;
    assert_eq!(raw, String::from_utf8_lossy(&output).as_bytes());
    server.stop().await;
}

/// Runs `troupe session watch --tree <tree>` until it printed the root's
/// `failed` event (30 s at most); returns what it printed.
async fn watch_until_failed(mut command: Command, tree: &str, args: &[&str]) -> Vec<u8> {
    let mut watch = command
        .args(args)
        .args(["session", "watch", "--tree", tree])
        .stdout(Stdio::piped())
        .spawn()
        .expect("watch runs");
    tokio::task::spawn_blocking(move || read_until_failed(&mut watch))
        .await
        .expect("joined")
}

fn read_until_failed(watch: &mut std::process::Child) -> Vec<u8> {
    let mut lines = BufReader::new(watch.stdout.take().expect("stdout")).split(b'\n');
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut printed = Vec::new();
    while Instant::now() < deadline {
        let Some(Ok(line)) = lines.next() else { break };
        printed.extend_from_slice(&line);
        printed.push(b'\n');
        if line.windows(6).any(|w| w == b"failed") {
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    printed
}
