//! `troupe-demo-agent` against a real session service in this process: the
//! agent reads its plan and messages from stdin as Troupe writes them,
//! drives `troupe-mcp` as its MCP client over the service's Unix socket, and
//! reports each step as a JSON line. There is no runner here, so children
//! stay pending and messages to them are queued; the `session_ended`
//! notices a runner would cause are written to the agent's stdin by the
//! test, as Troupe writes them.

mod callbacks;
mod plans;
mod stdin;

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
