//! `troupe-demo-agent` against a real session service in this process: the
//! agent reads its plan and messages from stdin as Troupe writes them,
//! drives `troupe-mcp` as its MCP client over the service's Unix socket, and
//! reports each step as a JSON line. There is no runner here, so children
//! stay pending and messages to them are queued; the `session_ended`
//! notices a runner would cause are written to the agent's stdin by the
//! test, as Troupe writes them.

use std::{process::Stdio, time::Duration};

use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines},
    process::{Child, ChildStdin, ChildStdout, Command},
};
use troupe_proto::session::TrustLevel;
use troupe_tests::{TestServer, child, create_child, get};

const AGENT: &str = env!("CARGO_BIN_EXE_troupe-demo-agent");
const BRIDGE: &str = env!("CARGO_BIN_EXE_troupe-mcp");
const STEP: Duration = Duration::from_secs(10);

/// A running demo agent and the events it printed so far.
struct Agent {
    process: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    events: Vec<Value>,
    sequence: u64,
}

/// A finished agent: its exit code and every event.
struct Run {
    code: Option<i32>,
    events: Vec<Value>,
}

impl Agent {
    /// Starts the agent with Troupe's environment for `session` (id and
    /// parent), or with none.
    async fn start(server: Option<&TestServer>, session: Option<(&str, Option<&str>)>) -> Agent {
        let mut command = Command::new(AGENT);
        command
            .env("TROUPE_MCP_COMMAND", BRIDGE)
            .env_remove("TROUPE_SESSION_ID")
            .env_remove("TROUPE_PARENT_SESSION_ID")
            .env_remove("TROUPE_SESSION_TOKEN")
            .env_remove("TROUPE_SESSION_ENDPOINT")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let (Some(server), Some((session_id, parent))) = (server, session) {
            let socket = server.config.socket().expect("a Unix socket");
            command
                .env("TROUPE_SESSION_ID", session_id)
                .env("TROUPE_SESSION_TOKEN", server.token_for(session_id).await)
                .env(
                    "TROUPE_SESSION_ENDPOINT",
                    format!("unix://{}", socket.display()),
                );
            if let Some(parent) = parent {
                command.env("TROUPE_PARENT_SESSION_ID", parent);
            }
        }
        let mut process = command.spawn().expect("the demo agent starts");
        let stdin = process.stdin.take();
        let stdout = BufReader::new(process.stdout.take().expect("stdout")).lines();
        Agent {
            process,
            stdin,
            stdout,
            events: Vec::new(),
            sequence: 0,
        }
    }

    /// Writes a message line as Troupe does.
    async fn write(&mut self, sender: &str, message: &str) {
        self.sequence += 1;
        let line = json!({
            "type": "message",
            "sequence": self.sequence,
            "message_id": format!("msg_test{}", self.sequence),
            "sender": sender,
            "message": message,
        });
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("line written");
        stdin.flush().await.expect("flushed");
    }

    /// Writes Troupe's notice that `session_id` ended.
    async fn ended(&mut self, session_id: &str, status: &str, exit_code: i32, tail: &str) {
        let notice = json!({
            "type": "session_ended", "session_id": session_id, "status": status,
            "exit_code": exit_code, "reason": "", "output_tail": tail,
        });
        self.write("troupe", &notice.to_string()).await;
    }

    async fn next_event(&mut self) -> Option<Value> {
        let line = tokio::time::timeout(STEP, self.stdout.next_line())
            .await
            .unwrap_or_else(|_| panic!("no event within {STEP:?} after {:#?}", self.events))
            .expect("stdout readable")?;
        let event: Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        self.events.push(event.clone());
        Some(event)
    }

    /// Reads events up to the `count`-th one named `name`.
    async fn until(&mut self, name: &str, count: usize) {
        let mut seen = 0;
        while seen < count {
            let event = self
                .next_event()
                .await
                .unwrap_or_else(|| panic!("stdout ended before {name}: {:#?}", self.events));
            if event["event"] == name {
                seen += 1;
            }
        }
    }

    /// Closes stdin (or not), reads the remaining events and waits for the exit.
    async fn finish(mut self, close_stdin: bool) -> Run {
        if close_stdin {
            self.stdin = None;
        }
        while self.next_event().await.is_some() {}
        let status = tokio::time::timeout(STEP, self.process.wait())
            .await
            .expect("the agent exits")
            .expect("exit status");
        Run {
            code: status.code(),
            events: self.events,
        }
    }
}

impl Run {
    fn all(&self, name: &str) -> Vec<&Value> {
        self.events.iter().filter(|e| e["event"] == name).collect()
    }

    fn one(&self, name: &str) -> &Value {
        let found = self.all(name);
        assert_eq!(found.len(), 1, "one {name} event in {:#?}", self.events);
        found[0]
    }

    fn names(&self) -> Vec<&str> {
        self.events
            .iter()
            .map(|e| e["event"].as_str().expect("event name"))
            .collect()
    }
}

fn id_of(event: &Value) -> String {
    event["session_id"].as_str().expect("session_id").to_owned()
}

fn text_of(event: &Value) -> &str {
    event["text"].as_str().expect("text")
}

async fn inbox_count(server: &TestServer, session_id: &str) -> u64 {
    server
        .operator()
        .await
        .get_session(get(session_id))
        .await
        .expect("get")
        .into_inner()
        .inbox_count
}

#[tokio::test]
async fn root_plan_spawns_refuses_lists_sends_waits_and_exits_with_its_code() {
    let server = TestServer::start().await;
    let (root, _, _) = server.root("ws", TrustLevel::Direct).await;
    let root_id = root.session_id.as_str();
    let child_plan = json!({"say": "hi", "exit": 0});
    let plan = json!({
        "say": "assembling the team",
        "spawn": [
            {"agent": "worker", "title": "backend", "message": child_plan},
            {"agent": "nobody", "message": "never"},
            {"agent": "worker", "title": "docs", "message": "write docs"},
        ],
        "list": true,
        "send": [{"to": "children", "message": "status?"}],
        "wait_messages": 1,
        "collect": true,
        "collect_timeout_s": 0.5,
        "reply": "all done",
        "exit": 3,
    });
    let mut agent = Agent::start(Some(&server), Some((root_id, None))).await;
    agent.write("operator", &plan.to_string()).await;
    agent.until("sent", 2).await;
    agent.write("operator", "keep going").await;
    let run = agent.finish(false).await;

    assert_eq!(run.code, Some(3), "{:#?}", run.events);
    assert_eq!(
        run.names(),
        [
            "say", "spawned", "refused", "spawned", "listed", "sent", "sent", "message", "timeout",
            "error", "done"
        ],
        "{:#?}",
        run.events
    );
    assert_eq!(text_of(run.one("say")), "assembling the team");
    let spawned = run.all("spawned");
    let children: Vec<String> = spawned.iter().map(|e| id_of(e)).collect();
    for (event, title) in spawned.iter().zip(["backend", "docs"]) {
        assert_eq!(event["agent"], "worker");
        assert_eq!(event["title"], title);
        assert_eq!(event["depth"], 1);
        assert_eq!(event["mode"], "callback");
    }
    let refused = run.one("refused");
    assert_eq!(refused["reason"], "AGENT_NOT_FOUND", "{refused}");
    assert_eq!(refused["agent"], "nobody");
    assert!(text_of(refused).contains("AGENT_NOT_FOUND"), "{refused}");

    let mut listed: Vec<&str> = run.one("listed")["session_ids"]
        .as_array()
        .expect("session_ids")
        .iter()
        .map(|v| v.as_str().expect("id"))
        .collect();
    listed.sort_unstable();
    let mut expected = vec![root_id, &children[0], &children[1]];
    expected.sort_unstable();
    assert_eq!(listed, expected);

    for (sent, child_id) in run.all("sent").iter().zip(&children) {
        assert_eq!(sent["to"], child_id.as_str());
        assert_eq!(sent["delivery"], "queued", "no runner, so queued: {sent}");
    }
    let message = run.one("message");
    assert_eq!(message["from"], "operator");
    assert_eq!(message["message"], "keep going");
    assert_eq!(run.one("timeout")["pending"], json!(children));
    assert!(
        text_of(run.one("error")).contains("no parent"),
        "a root's reply is skipped: {:#?}",
        run.events
    );
    assert_eq!(run.one("done")["exit_code"], 3);

    // Each child holds its first message (the plan as JSON text) and "status?".
    for child_id in &children {
        assert_eq!(inbox_count(&server, child_id).await, 2);
    }
    server.stop().await;
}

#[tokio::test]
async fn collect_reports_each_callback_child_and_the_messages_meanwhile() {
    let server = TestServer::start().await;
    let (root, _, _) = server.root("ws", TrustLevel::Direct).await;
    let plan = json!({
        "spawn": [
            {"agent": "worker", "title": "a"},
            {"agent": "worker", "title": "b", "mode": "callback"},
            {"agent": "worker", "title": "c", "mode": "async"},
        ],
        "wait_messages": 1,
        "collect": true,
        "collect_timeout_s": 10,
    });
    let mut agent = Agent::start(Some(&server), Some((&root.session_id, None))).await;
    agent.write("operator", &plan.to_string()).await;
    agent.until("spawned", 3).await;
    let ids: Vec<String> = agent.events.iter().map(id_of).collect();
    let long_tail = format!("{}END", "x".repeat(500));
    // a's end arrives while the agent waits for a message: it is kept for collect.
    agent.ended(&ids[0], "completed", 0, &long_tail).await;
    agent.write(&format!("session:{}", ids[2]), "a note").await;
    // Notices of sessions it does not collect are ignored; c is async.
    agent.ended("sess_unrelated", "failed", 1, "").await;
    agent.ended(&ids[2], "completed", 0, "").await;
    agent.write("operator", "carry on").await;
    agent.ended(&ids[1], "failed", 7, "boom").await;
    let run = agent.finish(false).await;

    assert_eq!(run.code, Some(0), "{:#?}", run.events);
    assert_eq!(
        run.names(),
        [
            "spawned",
            "spawned",
            "spawned",
            "message",
            "child_ended",
            "message",
            "child_ended",
            "done"
        ],
        "{:#?}",
        run.events
    );
    let messages = run.all("message");
    assert_eq!(messages[0]["from"], format!("session:{}", ids[2]));
    assert_eq!(messages[0]["message"], "a note");
    assert_eq!(messages[1]["from"], "operator");
    let ended = run.all("child_ended");
    assert_eq!(ended[0]["session_id"], ids[0].as_str());
    assert_eq!(ended[0]["status"], "completed");
    assert_eq!(ended[0]["exit_code"], 0);
    let tail = ended[0]["output_tail"].as_str().expect("tail");
    assert!(
        tail.ends_with("END") && tail.chars().count() == 200,
        "{tail}"
    );
    assert_eq!(ended[1]["session_id"], ids[1].as_str());
    assert_eq!(ended[1]["status"], "failed");
    assert_eq!(ended[1]["exit_code"], 7);
    assert_eq!(ended[1]["output_tail"], "boom");
    server.stop().await;
}

#[tokio::test]
async fn child_plan_is_refused_at_the_depth_limit_and_replies_to_its_parent() {
    let server = TestServer::start_with(|config| config.limits.max_depth = 1).await;
    let (root, mut root_client, _) = server.root("ws", TrustLevel::Direct).await;
    let sub = create_child(&mut root_client, child("sub")).await;
    let before = inbox_count(&server, &root.session_id).await;
    let plan = json!({
        "spawn": [{"agent": "worker", "title": "too deep"}],
        "send": [{"to": "parent", "message": "starting"}],
        "collect": true,
        "reply": "finished",
    });
    let mut agent = Agent::start(
        Some(&server),
        Some((&sub.session_id, Some(&root.session_id))),
    )
    .await;
    agent.write("operator", &plan.to_string()).await;
    let run = agent.finish(false).await;

    assert_eq!(run.code, Some(0), "{:#?}", run.events);
    assert_eq!(run.names(), ["refused", "sent", "sent", "done"]);
    let refused = run.one("refused");
    assert_eq!(refused["reason"], "DEPTH_EXCEEDED", "{refused}");
    assert!(text_of(refused).contains("depth_remaining=0"), "{refused}");
    for sent in run.all("sent") {
        assert_eq!(sent["to"], root.session_id.as_str());
        assert_eq!(sent["delivery"], "queued", "{sent}");
    }
    assert_eq!(inbox_count(&server, &root.session_id).await, before + 2);
    server.stop().await;
}

#[tokio::test]
async fn stdin_closed_before_the_plan_or_during_a_wait_is_an_error() {
    let agent = Agent::start(None, None).await;
    let run = agent.finish(true).await;
    assert_eq!(run.code, Some(2));
    assert_eq!(run.names(), ["error"]);
    assert!(text_of(run.one("error")).contains("before the plan"));

    // Text that is not a JSON object is said; no bridge is needed for that.
    let mut agent = Agent::start(None, None).await;
    agent.write("operator", "just saying").await;
    let run = agent.finish(true).await;
    assert_eq!(run.code, Some(0));
    assert_eq!(run.names(), ["say", "done"]);
    assert_eq!(text_of(run.one("say")), "just saying");

    let mut agent = Agent::start(None, None).await;
    agent.write("operator", r#"{"wait_messages": 2}"#).await;
    agent.write("operator", "one").await;
    let run = agent.finish(true).await;
    assert_eq!(run.code, Some(1));
    assert_eq!(run.names(), ["message", "error"]);
    assert!(text_of(run.one("error")).contains("after 1 of the 2 messages"));

    let mut agent = Agent::start(None, None).await;
    agent.write("operator", r#"{"spwan": []}"#).await;
    let run = agent.finish(true).await;
    assert_eq!(
        run.code,
        Some(2),
        "a plan with unknown fields: {:#?}",
        run.events
    );
    assert!(text_of(run.one("error")).contains("not valid"));
}
