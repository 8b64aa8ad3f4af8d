//! Harness of the runner's tests: a real `troupe-runner` served in-process
//! on 127.0.0.1, against the real Docker engine of `DOCKER_HOST` and the
//! image `scripts/build-image` makes. Without an engine the tests fail:
//! `scripts/test` starts one.

#![allow(dead_code)]

pub mod claude;
pub mod clis;
mod execs;
pub mod pair;
pub mod private_engine;
pub mod replicas;
pub mod runners;

// The benches, which mount this file too, use some of these, or none.
#[allow(unused_imports)]
pub use execs::*;

use std::{
    collections::HashMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use tokio::sync::oneshot;
use tonic::{service::interceptor::InterceptedService, transport::Channel};
use tonic_health::pb::health_client::HealthClient;
pub use troupe_proto::endpoint::Bearer;
use troupe_proto::runner::{StartExecRequest, runner_service_client::RunnerServiceClient};
use troupe_runner_svc::{Config, docker::Engine};

pub const TOKEN: &str = "test-operator-token-0123456789";
pub const IMAGE: &str = "troupe-workspace:latest";

/// How long a test waits for what should come in seconds.
pub const MINUTE: Duration = Duration::from_secs(60);

pub type Client = RunnerServiceClient<InterceptedService<Channel, Bearer>>;

/// A runner serving on a loopback port, with its own data directory.
pub struct TestRunner {
    pub dir: tempfile::TempDir,
    pub config: Config,
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    workspaces: std::sync::Mutex<Vec<String>>,
}

impl TestRunner {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// As [`TestRunner::start`], called with the session service's operator
    /// token, as a session service that drives it calls it.
    pub async fn driven() -> Self {
        Self::start_with(|c| c.operator_token = Some(troupe_tests::OPERATOR_TOKEN.into())).await
    }

    pub async fn start_with(configure: impl FnOnce(&mut Config)) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        Self::start_on(listener, configure).await
    }

    /// As [`TestRunner::start_with`], serving on `listener`: bound first, so
    /// that a peer started before the runner can be given its address.
    pub async fn start_on(
        listener: tokio::net::TcpListener,
        configure: impl FnOnce(&mut Config),
    ) -> Self {
        require_engine();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = Config::with_data_dir(dir.path().join("data"));
        config.operator_token = Some(TOKEN.into());
        config.tools_dir = Some(tools().to_path_buf());
        config.image = IMAGE.into();
        config.timeout_grace_ms = 500;
        config.uid_base = private_uid_base();
        configure(&mut config);
        let mut runner = TestRunner {
            dir,
            config,
            addr: "127.0.0.1:0".parse().unwrap(),
            stop: None,
            task: None,
            workspaces: std::sync::Mutex::new(Vec::new()),
        };
        runner.serve_on(listener).await;
        runner
    }

    /// Serves on the address of the last start.
    async fn serve(&mut self) {
        let listener = tokio::net::TcpListener::bind(self.addr)
            .await
            .expect("bind");
        self.serve_on(listener).await;
    }

    async fn serve_on(&mut self, listener: tokio::net::TcpListener) {
        self.addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel();
        let config = self.config.clone();
        self.task = Some(tokio::spawn(troupe_runner_svc::serve(
            config,
            listener,
            async move {
                let _ = rx.await;
            },
        )));
        self.stop = Some(tx);
        // Ready once the port answers a call.
        for _ in 0..200 {
            if let Ok(mut c) = self.try_client().await
                && c.list_execs(troupe_proto::runner::ListExecsRequest::default())
                    .await
                    .is_ok()
            {
                return;
            }
            if self.task.as_ref().unwrap().is_finished() {
                let result = self.task.take().unwrap().await.expect("join");
                panic!("runner stopped at start: {result:?}");
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("runner did not come up");
    }

    /// Stops the server (the execs keep running) and starts it again on the
    /// same state and address.
    pub async fn restart(&mut self) {
        self.stop().await;
        self.serve().await;
    }

    /// Starts a stopped server again on the same state and address.
    pub async fn start_again(&mut self) {
        self.serve().await;
    }

    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("join").expect("runner failed");
        }
    }

    async fn try_client(&self) -> Result<Client, tonic::transport::Error> {
        let channel = Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await?;
        Ok(RunnerServiceClient::with_interceptor(
            channel,
            Bearer::new(Some(self.config.operator_token.as_deref().unwrap_or(TOKEN))).unwrap(),
        )
        .max_decoding_message_size(16 << 20))
    }

    pub async fn client(&self) -> Client {
        self.try_client().await.expect("connect")
    }

    /// A connection to the runner that carries no token.
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .expect("connect")
    }

    /// The runner's health service, which asks for no token.
    pub async fn health(&self) -> HealthClient<Channel> {
        HealthClient::new(self.channel().await)
    }

    /// The runner's relay socket (`--session-endpoint`), which agents reach
    /// as `/run/troupe/session/session.sock`.
    pub fn relay_socket(&self) -> PathBuf {
        match self.config.agent_socket().expect("agent socket") {
            troupe_runner_svc::AgentSocket::Relayed { socket, .. } => socket,
            local => panic!("not relayed: {local:?}"),
        }
    }

    /// The runner's execs, as it lists them.
    pub async fn execs(&self) -> Vec<troupe_proto::runner::ExecInfo> {
        list_execs(&mut self.client().await).await
    }

    /// A fresh workspace id, whose container is removed when the runner drops.
    pub fn workspace(&self, name: &str) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        let id = format!(
            "t-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        self.workspaces.lock().unwrap().push(id.clone());
        id
    }

    /// Host path of an exec's directory.
    pub fn exec_dir(&self, workspace: &str, exec_id: &str) -> PathBuf {
        self.config
            .state_dir()
            .join("workspaces")
            .join(workspace)
            .join("execs")
            .join(exec_id)
    }

    /// Starts `sh -c script` in `workspace`.
    pub async fn sh(&self, workspace: &str, exec_id: &str, script: &str) -> StartExecRequest {
        let req = start_request(workspace, exec_id, &["sh", "-c", script]);
        self.client()
            .await
            .start_exec(req.clone())
            .await
            .expect("start exec");
        req
    }
}

impl Drop for TestRunner {
    fn drop(&mut self) {
        let names: Vec<String> = self
            .workspaces
            .lock()
            .unwrap()
            .iter()
            .map(|w| Engine::container_name(w))
            .collect();
        remove_containers(names);
    }
}

/// Removes the named containers by force, from a thread of its own: for a
/// `Drop`, which cannot await.
pub fn remove_containers(names: Vec<String>) {
    if names.is_empty() {
        return;
    }
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
                let options = bollard::query_parameters::RemoveContainerOptionsBuilder::default()
                    .force(true)
                    .build();
                let _ = docker.remove_container(&name, Some(options)).await;
            }
        });
    })
    .join()
    .ok();
}

/// A range of 10,000 uids no other runner of these tests uses, even in
/// other test processes at the same time: `RLIMIT_NPROC` counts a uid's
/// processes on the whole host, so runners sharing uids would share their
/// execs' process limits. A process has 1,024 ranges, taken in turn: the
/// one test binary starts about a hundred runners, past the 64 a process
/// had when each file was a binary. The highest uid stays below 2^31.
pub fn private_uid_base() -> u32 {
    static N: AtomicU32 = AtomicU32::new(0);
    let slot = (std::process::id() % 200) * 1024 + N.fetch_add(1, Ordering::SeqCst) % 1024;
    10_000_000 + slot * 10_000
}

/// The tools directory every runner of this process mounts: the supervisor
/// and the agent tools, installed once.
pub fn tools() -> &'static Path {
    static TOOLS: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    TOOLS.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("troupe-tools");
        troupe_runner_svc::install_tools(Path::new(env!("CARGO_BIN_EXE_troupe-runner")), &dir)
            .expect("install tools")
    })
}

/// A client of the engine the tests use.
pub async fn docker() -> bollard::Docker {
    bollard::Docker::connect_with_defaults()
        .unwrap()
        .negotiate_version()
        .await
        .unwrap()
}

/// Removes the workspace's container by force, running execs and all.
pub async fn remove_container(workspace: &str) {
    docker()
        .await
        .remove_container(
            &Engine::container_name(workspace),
            Some(
                bollard::query_parameters::RemoveContainerOptionsBuilder::default()
                    .force(true)
                    .build(),
            ),
        )
        .await
        .expect("remove container");
}

/// Panics, with what to do, when no Docker engine is reachable.
pub fn require_engine() {
    let host = std::env::var("DOCKER_HOST").unwrap_or_default();
    let socket = host
        .strip_prefix("unix://")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/run/docker.sock"));
    assert!(
        !host.is_empty() && !host.starts_with("unix://") || socket.exists(),
        "these tests need a Docker engine and the image {IMAGE}: run scripts/test, \
         or `source scripts/docker-env && scripts/build-image` first (DOCKER_HOST={host:?})"
    );
}

pub fn start_request(workspace: &str, exec_id: &str, command: &[&str]) -> StartExecRequest {
    StartExecRequest {
        exec_id: exec_id.into(),
        workspace_id: workspace.into(),
        command: command.iter().map(|s| s.to_string()).collect(),
        env: HashMap::new(),
        ..Default::default()
    }
}

/// The definition of a test agent `name` that runs `command`.
pub fn test_agent(name: &str, command: &[&str]) -> String {
    let command = serde_json::to_string(command).unwrap();
    format!("---\nname: {name}\ndescription: test agent\ncommand: {command}\n---\n")
}

/// Creates a direct root session of `agent` in `workspace`, given `message`.
pub async fn direct_root(
    client: &mut troupe_tests::Client,
    workspace: &str,
    agent: &str,
    message: &str,
) -> troupe_proto::session::Session {
    client
        .create_root_session(troupe_proto::session::CreateRootSessionRequest {
            workspace_id: workspace.into(),
            trust_level: troupe_proto::session::TrustLevel::Direct as i32,
            title: "root".into(),
            agent_name: agent.into(),
            initial_message: message.into(),
            request_id: String::new(),
            budget: None,
            writable_paths: Vec::new(),
        })
        .await
        .expect("create root")
        .into_inner()
        .session
        .unwrap()
}
