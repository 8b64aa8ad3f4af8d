//! `troupe-mcp claude-input`, the real binary: Troupe's message lines in,
//! Claude Code stream-json user messages out, each written as soon as its
//! line arrives, and a clean exit when stdin ends.

use std::{process::Stdio, time::Duration};

use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines},
    process::{Child, ChildStdout, Command},
};

const BRIDGE: &str = env!("CARGO_BIN_EXE_troupe-mcp");
const STEP: Duration = Duration::from_secs(10);

fn start() -> Child {
    Command::new(BRIDGE)
        .arg("claude-input")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("troupe-mcp starts")
}

fn troupe_line(sequence: u64, sender: &str, message: &str) -> String {
    let line = json!({"type": "message", "sequence": sequence, "message_id": format!("msg_{sequence}"),
                      "sender": sender, "message": message});
    format!("{line}\n")
}

/// The next output line, parsed, checked as a user message; returns its content.
async fn next_content(stdout: &mut Lines<BufReader<ChildStdout>>) -> String {
    let line = tokio::time::timeout(STEP, stdout.next_line())
        .await
        .expect("a line in time")
        .expect("readable stdout")
        .expect("a line before the end");
    let value: Value = serde_json::from_str(&line).expect("each line is JSON");
    assert_eq!(value["type"], "user", "{line}");
    assert_eq!(value["message"]["role"], "user", "{line}");
    assert_eq!(value["parent_tool_use_id"], Value::Null, "{line}");
    assert_eq!(value["session_id"], "default", "{line}");
    value["message"]["content"]
        .as_str()
        .expect("text content")
        .to_owned()
}

#[tokio::test]
async fn claude_input_turns_each_troupe_line_into_a_user_message_at_once() {
    let mut child = start();
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();

    // Each message comes out before the next goes in: a waiting agent gets
    // it without more input or the end of stdin.
    stdin
        .write_all(troupe_line(1, "operator", "write the handlers").as_bytes())
        .await
        .unwrap();
    let first = next_content(&mut stdout).await;
    assert!(first.starts_with("Message 1 from the operator"), "{first}");
    assert!(first.ends_with(":\nwrite the handlers"), "{first}");
    assert!(!first.contains("send_message"), "{first}");

    let text = "use axum, \"not\" actix\nsecond line: héllo 🎭";
    stdin
        .write_all(troupe_line(2, "session:sess_abc", text).as_bytes())
        .await
        .unwrap();
    let second = next_content(&mut stdout).await;
    assert!(
        second.starts_with(
            "Message 2 from session:sess_abc (reply with send_message to session_id \"sess_abc\")"
        ),
        "{second}"
    );
    assert!(second.ends_with(&format!(":\n{text}")), "{second}");

    let notice = json!({"type": "session_ended", "session_id": "sess_kid", "status": "completed",
                        "exit_code": 0, "reason": "exited", "output_tail": "done"})
    .to_string();
    let rest = format!(
        "{}typed by hand\n\n{}",
        troupe_line(3, "troupe", &notice),
        troupe_line(4, "session:sess_kid", "last words").trim_end()
    );
    stdin.write_all(rest.as_bytes()).await.unwrap();
    drop(stdin);

    let third = next_content(&mut stdout).await;
    assert!(third.starts_with("Message 3 from troupe"), "{third}");
    assert!(third.ends_with(&format!(":\n{notice}")), "{third}");
    assert!(!third.contains("send_message"), "{third}");
    assert_eq!(next_content(&mut stdout).await, "typed by hand");
    let last = next_content(&mut stdout).await;
    assert!(last.contains("session:sess_kid"), "{last}");
    assert!(last.ends_with(":\nlast words"), "{last}");

    let end = tokio::time::timeout(STEP, stdout.next_line())
        .await
        .expect("stdout ends in time")
        .expect("readable stdout");
    assert_eq!(end, None, "one output line per input line");
    let status = tokio::time::timeout(STEP, child.wait())
        .await
        .expect("exits when stdin ends")
        .expect("wait");
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn claude_input_with_no_input_writes_nothing_and_exits_cleanly() {
    let mut child = start();
    drop(child.stdin.take());
    let output = tokio::time::timeout(STEP, child.wait_with_output())
        .await
        .expect("exits when stdin ends")
        .expect("wait");
    assert!(output.status.success(), "{}", output.status);
    assert!(output.stdout.is_empty());
}
