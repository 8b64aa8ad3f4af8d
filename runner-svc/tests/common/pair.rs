//! A runner and a session service that drives it, both real and in this
//! process, and the scripted team the end-to-end tests run.

use std::time::Duration;

use troupe_proto::session::{self as pb, CreateSessionRequest, ExecutionMode, SessionStatus};
use troupe_tests::{OPERATOR_TOKEN, TestServer};

use super::TestRunner;

pub use super::MINUTE;

/// A runner and a session service that drives it, sharing workspaces.
pub struct Pair {
    pub runner: TestRunner,
    pub server: TestServer,
    _sockets: tempfile::TempDir,
}

impl Pair {
    pub async fn start() -> Pair {
        Pair::start_with(|_| {}).await
    }

    /// As [`Pair::start`], with the session service's configuration adjusted.
    pub async fn start_with(adjust: impl FnOnce(&mut troupe_session_svc::Config)) -> Pair {
        Pair::start_on(|_| {}, adjust).await
    }

    /// As [`Pair::start`], with both configurations adjusted.
    pub async fn start_on(
        adjust_runner: impl FnOnce(&mut troupe_runner_svc::Config),
        adjust: impl FnOnce(&mut troupe_session_svc::Config),
    ) -> Pair {
        // The session service's socket, which the runner mounts into containers.
        let sockets = tempfile::tempdir().unwrap();
        let socket = sockets.path().join("session.sock");
        let runner_socket = socket.clone();
        let runner = TestRunner::start_with(|c| {
            c.operator_token = Some(OPERATOR_TOKEN.into());
            c.session_socket = Some(runner_socket);
            adjust_runner(c);
        })
        .await;
        let endpoint = format!("http://{}", runner.addr);
        let server = TestServer::start_with(|c| {
            c.runner = Some(endpoint);
            c.socket = Some(socket);
            adjust(c);
        })
        .await;
        Pair {
            runner,
            server,
            _sockets: sockets,
        }
    }

    /// A session service that serves TCP only (no Unix socket), and a
    /// runner that relays its agents' socket to it (`--session-endpoint`,
    /// the list `endpoints` makes of the service's address).
    pub async fn relayed(
        endpoints: impl FnOnce(std::net::SocketAddr) -> Vec<String>,
        adjust_runner: impl FnOnce(&mut troupe_runner_svc::Config),
    ) -> Pair {
        // The runner's address first: the service is told it, then the
        // runner is told the service's.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let runner_addr = listener.local_addr().unwrap();
        let server = TestServer::start_with(|c| {
            c.runner = Some(format!("http://{runner_addr}"));
            c.socket = Some("none".into());
        })
        .await;
        assert_eq!(server.config.socket(), None, "the service serves TCP only");
        let session_endpoint = endpoints(server.addr);
        let runner = TestRunner::start_on(listener, |c| {
            c.operator_token = Some(OPERATOR_TOKEN.into());
            c.session_endpoint = session_endpoint;
            adjust_runner(c);
        })
        .await;
        Pair {
            runner,
            server,
            _sockets: tempfile::tempdir().unwrap(),
        }
    }

    /// The runner's relay socket ([`TestRunner::relay_socket`]).
    pub fn relay_socket(&self) -> std::path::PathBuf {
        self.runner.relay_socket()
    }

    /// A fresh workspace whose agent `name` runs `sh -c script`.
    pub fn agent(&self, ws: &str, name: &str, script: &str) {
        self.agent_command(ws, name, &["sh", "-c", script]);
    }

    pub fn agent_command(&self, ws: &str, name: &str, command: &[&str]) {
        self.server
            .write_agent_text(Some(ws), name, &super::test_agent(name, command));
    }

    pub async fn root(&self, ws: &str, agent: &str, message: &str) -> pb::Session {
        super::direct_root(&mut self.server.operator().await, ws, agent, message).await
    }

    /// A sandboxed root of `ws` running `agent`, titled with its name.
    pub async fn sandboxed_root(&self, ws: &str, agent: &str) -> pb::Session {
        self.server
            .operator()
            .await
            .create_root_session(pb::CreateRootSessionRequest {
                workspace_id: ws.to_owned(),
                trust_level: pb::TrustLevel::Sandboxed as i32,
                title: agent.into(),
                agent_name: agent.into(),
                ..Default::default()
            })
            .await
            .expect("a sandboxed root")
            .into_inner()
            .session
            .expect("the session")
    }

    /// As [`Pair::root`], once its agent runs.
    pub async fn running_root(&self, ws: &str, agent: &str, message: &str) -> pb::Session {
        let root = self.root(ws, agent, message).await;
        self.wait_status(&root.session_id, SessionStatus::Running)
            .await;
        root
    }

    pub async fn child(
        &self,
        parent: &str,
        agent: &str,
        mode: ExecutionMode,
    ) -> pb::CreateSessionResponse {
        self.server
            .operator()
            .await
            .create_session(CreateSessionRequest {
                title: agent.into(),
                agent_name: agent.into(),
                initial_message: format!("hello {agent}"),
                parent_session_id: parent.into(),
                mode: mode as i32,
                ..Default::default()
            })
            .await
            .expect("create child")
            .into_inner()
    }

    pub async fn get(&self, id: &str) -> pb::GetSessionResponse {
        self.server.get(id).await
    }

    /// Waits until `root`'s output holds the notice of `child`'s end (the root
    /// agent echoes its stdin lines); returns the notice.
    pub async fn notice_of(&self, root: &str, child: &str) -> serde_json::Value {
        let deadline = tokio::time::Instant::now() + MINUTE;
        loop {
            let tail = self
                .get(root)
                .await
                .result
                .map(|r| r.output_tail)
                .unwrap_or_default();
            let notice = tail
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|line| line["sender"] == "troupe")
                .filter_map(|line| {
                    serde_json::from_str::<serde_json::Value>(line["message"].as_str()?).ok()
                })
                .find(|notice| notice["session_id"] == child);
            if let Some(notice) = notice {
                return notice;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no notice of {child} in {tail}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the session has completed; returns the JSON lines its
    /// agent printed ([`events`] of its output).
    pub async fn completed_events(&self, id: &str) -> Vec<serde_json::Value> {
        let done = self.wait_status(id, SessionStatus::Completed).await;
        events(&done.result.expect("a result").output_tail)
    }

    /// Waits until the session's output tail holds `needle` (within a
    /// minute); returns the tail.
    pub async fn tail_with(&self, id: &str, needle: &str) -> String {
        self.tail_within(id, needle, MINUTE, String::new).await
    }

    /// As [`Pair::tail_with`], within `limit`; a miss also shows `context()`.
    pub async fn tail_within(
        &self,
        id: &str,
        needle: &str,
        limit: Duration,
        context: impl Fn() -> String,
    ) -> String {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let tail = self
                .get(id)
                .await
                .result
                .map(|r| r.output_tail)
                .unwrap_or_default();
            if tail.contains(needle) {
                return tail;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{id} never printed {needle:?}: {tail}{}",
                context()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The session's usage, as the operator reads it.
    pub async fn usage(&self, id: &str) -> pb::SessionUsage {
        self.get(id).await.session.unwrap().usage.unwrap()
    }

    /// The events of the session, as the operator watches them.
    pub async fn watch(&self, id: &str) -> tonic::Streaming<pb::SessionEvent> {
        self.server
            .operator()
            .await
            .watch_sessions(pb::WatchSessionsRequest {
                session_id: id.into(),
                ..Default::default()
            })
            .await
            .expect("watch")
            .into_inner()
    }

    /// Terminates the session's tree as the operator.
    pub async fn terminate(&self, id: &str) {
        self.server
            .operator()
            .await
            .terminate_session(troupe_tests::terminate(id))
            .await
            .expect("terminate");
    }

    /// Waits until the session's status is `status`.
    pub async fn wait_status(&self, id: &str, status: SessionStatus) -> pb::GetSessionResponse {
        let deadline = tokio::time::Instant::now() + MINUTE;
        loop {
            let got = self.get(id).await;
            if got.session.as_ref().unwrap().status() == status {
                return got;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{id} never became {status:?}: {got:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Fails unless the agent tools the runner mounts were built.
pub fn require_agent_tools() {
    for tool in troupe_runner_svc::AGENT_TOOLS {
        let path = std::path::Path::new(env!("CARGO_BIN_EXE_troupe-runner")).with_file_name(tool);
        assert!(
            path.is_file(),
            "{} is missing: build it with `cargo build -p troupe-mcp-bridge`",
            path.display()
        );
    }
}

/// The scripted team: a coordinator spawns a backend lead, which spawns a
/// handlers specialist, whose own spawn the depth limit (2) refuses;
/// messages go down from the coordinator and up from each child.
pub fn team_plan() -> serde_json::Value {
    let handlers = serde_json::json!({
        "say": "handlers",
        "spawn": [{"agent": "specialist", "title": "too deep", "message": {"say": "never"}}],
        "reply": "handlers done",
    });
    let backend = serde_json::json!({
        "say": "backend lead",
        "spawn": [{"agent": "specialist", "title": "handlers", "mode": "callback", "message": handlers}],
        "wait_messages": 1,
        "collect": true,
        "reply": "backend done",
    });
    let plan = serde_json::json!({
        "say": "coordinating",
        "spawn": [{"agent": "specialist", "title": "backend", "mode": "callback", "message": backend}],
        "send": [{"to": "children", "message": "use axum"}],
        "wait_messages": 1,
        "collect": true,
    });
    plan
}

/// The JSON lines an agent printed.
pub fn events(output: &str) -> Vec<serde_json::Value> {
    output
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}
