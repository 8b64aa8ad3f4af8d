//! Several runners: two real `troupe-runner` processes, each with its own
//! data directory, address, uid range and container prefix on the one
//! Docker engine, registered (`--register`) with a real session service.
//! Workspaces are placed by room and stay on their runner; a runner killed
//! (SIGKILL) mid-tree has its sessions end `runner_lost` within its lease
//! plus a margin, the CALLBACK parent is told, a new session of the
//! workspace runs on the other runner, and what the killed runner still
//! runs is stopped once it registers again.

mod common;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use common::{Client, IMAGE, MINUTE, pair::require_agent_tools};
use tokio::process::{Child, Command};
use troupe_proto::{
    endpoint::Bearer,
    runner::{ExecState, ListExecsRequest, runner_service_client::RunnerServiceClient},
    session::{
        self as pb, CreateRootSessionRequest, CreateSessionRequest, ExecutionMode,
        ListAuditRequest, SessionStatus, TrustLevel,
    },
};
use troupe_runner_svc::docker::Engine;
use troupe_tests::{OPERATOR_TOKEN, TestServer};

/// The runners' lease, and how often they renew it.
const TTL_MS: u64 = 1500;
const EVERY_MS: u64 = 250;

/// A `troupe-runner` process registered with a session service.
struct RunnerProcess {
    child: Option<Child>,
    name: String,
    prefix: String,
    addr: SocketAddr,
    args: Vec<String>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl RunnerProcess {
    /// Starts runner `name` of `capacity` agents, registering with `service`;
    /// agents reach the service through `socket`.
    async fn start(name: &str, capacity: u32, service: &str, socket: &Path) -> RunnerProcess {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let prefix = format!("troupe-t{}-{name}", std::process::id());
        let args = [
            "--listen",
            &addr.to_string(),
            "--data-dir",
            &dir.path().join("data").display().to_string(),
            "--session-socket",
            &socket.display().to_string(),
            "--tools-dir",
            &common::tools().display().to_string(),
            "--image",
            IMAGE,
            "--uid-base",
            &common::private_uid_base().to_string(),
            "--container-prefix",
            &prefix,
            "--timeout-grace-ms",
            "500",
            "--register",
            service,
            "--name",
            name,
            "--capacity",
            &capacity.to_string(),
            "--register-ttl-ms",
            &TTL_MS.to_string(),
            "--register-every-ms",
            &EVERY_MS.to_string(),
        ]
        .map(str::to_owned)
        .to_vec();
        let mut runner = RunnerProcess {
            child: None,
            name: name.to_owned(),
            prefix,
            addr,
            args,
            log: dir.path().join("runner.log"),
            _dir: dir,
        };
        runner.spawn().await;
        runner
    }

    /// Runs the binary (again, on the same data, address and name) and
    /// waits until its registration is taken.
    async fn spawn(&mut self) {
        let log = std::fs::File::create(&self.log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_troupe-runner"))
            .args(&self.args)
            .env("TROUPE_OPERATOR_TOKEN", OPERATOR_TOKEN)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("troupe-runner starts");
        self.child = Some(child);
        let deadline = Instant::now() + MINUTE;
        let registered = || {
            std::fs::read_to_string(&self.log)
                .unwrap_or_default()
                .contains("registered with the session service")
        };
        while !registered() {
            assert!(
                Instant::now() < deadline,
                "runner {} never registered: {}",
                self.name,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL: the runner dies at once; its agents run on in Docker.
    async fn kill(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().await.expect("kill");
    }

    async fn client(&self) -> Client {
        let channel = troupe_proto::endpoint::connect(&format!("http://{}", self.addr))
            .await
            .expect("connect");
        RunnerServiceClient::with_interceptor(channel, Bearer::new(Some(OPERATOR_TOKEN)).unwrap())
    }

    /// The runner's execs: `(session id, running)`.
    async fn execs(&self) -> Vec<(String, bool)> {
        let mut execs: Vec<(String, bool)> = self
            .client()
            .await
            .list_execs(ListExecsRequest::default())
            .await
            .expect("list execs")
            .into_inner()
            .execs
            .into_iter()
            .map(|e| {
                let running = e.state() == ExecState::Running;
                (e.exec_id, running)
            })
            .collect();
        execs.sort();
        execs
    }

    async fn exec_ids(&self) -> Vec<String> {
        self.execs().await.into_iter().map(|(id, _)| id).collect()
    }
}

impl Drop for RunnerProcess {
    /// A failed test shows what the runner logged.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- runner {} ---\n{}",
                self.name,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

/// Removes the tests' workspace containers, by force, at the end.
struct Containers(Vec<String>);

impl Containers {
    fn of(runners: &[&RunnerProcess], workspaces: &[&str]) -> Containers {
        Containers(
            runners
                .iter()
                .flat_map(|r| {
                    workspaces
                        .iter()
                        .map(|w| Engine::container_name_in(&r.prefix, w))
                })
                .collect(),
        )
    }
}

impl Drop for Containers {
    fn drop(&mut self) {
        let names = std::mem::take(&mut self.0);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let Ok(docker) = bollard::Docker::connect_with_defaults() else {
                    return;
                };
                for name in names {
                    let options =
                        bollard::query_parameters::RemoveContainerOptionsBuilder::default()
                            .force(true)
                            .build();
                    let _ = docker.remove_container(&name, Some(options)).await;
                }
            });
        })
        .join()
        .ok();
    }
}

/// A session service with the agent `idle` (prints `up`, then echoes its
/// stdin until it closes), and the socket its agents reach it by.
async fn service() -> (TestServer, PathBuf, tempfile::TempDir) {
    common::require_engine();
    require_agent_tools();
    let sockets = tempfile::tempdir().unwrap();
    let socket = sockets.path().join("session.sock");
    let server = TestServer::start_with(|c| c.socket = Some(socket.clone())).await;
    let command = serde_json::to_string(&["sh", "-c", "echo up; cat"]).unwrap();
    server.write_agent_text(
        None,
        "idle",
        &format!("---\nname: idle\ndescription: test agent\ncommand: {command}\n---\n"),
    );
    (server, socket, sockets)
}

fn workspace(tag: &str) -> String {
    format!("fl-{tag}-{}", std::process::id())
}

async fn root(server: &TestServer, ws: &str) -> String {
    server
        .operator()
        .await
        .create_root_session(CreateRootSessionRequest {
            workspace_id: ws.to_owned(),
            trust_level: TrustLevel::Direct as i32,
            title: "root".into(),
            agent_name: "idle".into(),
            initial_message: "hello".into(),
            request_id: String::new(),
        })
        .await
        .expect("create root")
        .into_inner()
        .session
        .unwrap()
        .session_id
}

/// Waits until the session's status is `status`; returns it.
async fn until_status(
    server: &TestServer,
    id: &str,
    status: SessionStatus,
    limit: Duration,
) -> pb::Session {
    let deadline = Instant::now() + limit;
    loop {
        let session = server.get(id).await.session.unwrap();
        if session.status() == status {
            return session;
        }
        assert!(
            Instant::now() < deadline,
            "{id} never became {status:?}: {session:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// New workspaces go to the runner with the most room (capacity minus
/// active sessions; ties by name); a workspace stays on its runner even
/// when the other has more room.
#[tokio::test]
async fn workspaces_spread_by_room_and_stay_on_their_runner() {
    let (server, socket, _sockets) = service().await;
    let endpoint = format!("http://{}", server.addr);
    let alpha = RunnerProcess::start("alpha", 1, &endpoint, &socket).await;
    let beta = RunnerProcess::start("beta", 3, &endpoint, &socket).await;
    let (w1, w2, w3) = (workspace("one"), workspace("two"), workspace("three"));
    let _containers = Containers::of(&[&alpha, &beta], &[&w1, &w2, &w3]);
    let mut placed = Vec::new();
    // Each starts before the next is made, so each sees the last's load.
    for ws in [&w1, &w2, &w3, &w3] {
        let id = root(&server, ws).await;
        until_status(&server, &id, SessionStatus::Running, MINUTE).await;
        placed.push(id);
    }
    let (s1, s2, s3, s4) = (&placed[0], &placed[1], &placed[2], &placed[3]);
    // beta (room 3, then 2) takes w1 and w2; then both have room 1 and
    // alpha comes first; w3's second session stays on alpha, now full,
    // though beta has room.
    let mut on_beta = vec![s1.clone(), s2.clone()];
    on_beta.sort();
    let mut on_alpha = vec![s3.clone(), s4.clone()];
    on_alpha.sort();
    assert_eq!(beta.exec_ids().await, on_beta);
    assert_eq!(alpha.exec_ids().await, on_alpha);
}

/// A runner killed mid-tree: its sessions fail `runner_lost` within its
/// lease plus a margin, deepest first, so the CALLBACK parent is told of
/// its child's end; a new session of the workspace runs on the other
/// runner; back (registered again), the runner's leftover agents are
/// stopped.
#[tokio::test]
async fn a_killed_runner_loses_its_sessions_and_its_workspace_moves() {
    let (server, socket, _sockets) = service().await;
    let endpoint = format!("http://{}", server.addr);
    let mut alpha = RunnerProcess::start("alpha", 10, &endpoint, &socket).await;
    let beta = RunnerProcess::start("beta", 2, &endpoint, &socket).await;
    let home = workspace("home");
    let _containers = Containers::of(&[&alpha, &beta], &[&home]);
    let parent = root(&server, &home).await;
    until_status(&server, &parent, SessionStatus::Running, MINUTE).await;
    let child = server
        .operator()
        .await
        .create_session(CreateSessionRequest {
            title: "child".into(),
            agent_name: "idle".into(),
            initial_message: "hello child".into(),
            parent_session_id: parent.clone(),
            mode: ExecutionMode::Callback as i32,
            ..Default::default()
        })
        .await
        .expect("create child")
        .into_inner()
        .session
        .unwrap()
        .session_id;
    until_status(&server, &child, SessionStatus::Running, MINUTE).await;
    let mut tree = vec![parent.clone(), child.clone()];
    tree.sort();
    assert_eq!(alpha.exec_ids().await, tree, "the tree runs on alpha");
    assert!(beta.exec_ids().await.is_empty());
    let inbox = server.get(&parent).await.inbox_count;

    alpha.kill().await;
    let killed = Instant::now();
    // The lease, the owner's poll (1 s) and a margin.
    let limit = Duration::from_millis(TTL_MS) + Duration::from_secs(4);
    for id in [&child, &parent] {
        let ended = until_status(&server, id, SessionStatus::Failed, limit).await;
        assert_eq!(ended.end_reason, "runner_lost", "{ended:?}");
    }
    assert!(killed.elapsed() < limit, "took {:?}", killed.elapsed());
    // The child ended first: its parent's notice is in the parent's inbox.
    assert_eq!(server.get(&parent).await.inbox_count, inbox + 1);
    let audit = server
        .operator()
        .await
        .list_audit(ListAuditRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert!(
        audit
            .iter()
            .any(|e| e.action == "callback" && e.target == parent && e.detail.contains(&child)),
        "no callback to the parent: {audit:?}"
    );
    for id in [&parent, &child] {
        assert!(
            audit
                .iter()
                .any(|e| e.action == "runner_lost" && &e.target == id && e.reason == "RUNNER_LOST"),
            "no RUNNER_LOST entry for {id}: {audit:?}"
        );
    }

    // The workspace has no active session left: a new one goes to beta.
    let next = root(&server, &home).await;
    until_status(&server, &next, SessionStatus::Running, MINUTE).await;
    assert_eq!(beta.exec_ids().await, std::slice::from_ref(&next));

    // alpha comes back on its data: its agents ran on meanwhile; its
    // return is reconciled and they are stopped.
    alpha.spawn().await;
    let deadline = Instant::now() + MINUTE;
    loop {
        let execs = alpha.execs().await;
        if execs.len() == 2 && execs.iter().all(|(_, running)| !running) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "alpha's leftover agents were not stopped: {execs:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The new session was not touched.
    assert_eq!(
        server.get(&next).await.session.unwrap().status(),
        SessionStatus::Running
    );
}
