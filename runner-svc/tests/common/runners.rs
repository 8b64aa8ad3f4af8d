//! Runners as separate `troupe-runner` processes registered with a session
//! service (`--register`), each with its own data directory, address, uid
//! range and container prefix on the one Docker engine; for the tests of
//! several runners.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use tokio::process::{Child, Command};
use troupe_proto::{
    endpoint::Bearer,
    runner::{ExecState, ListExecsRequest, runner_service_client::RunnerServiceClient},
};
use troupe_runner_svc::docker::Engine;
use troupe_tests::OPERATOR_TOKEN;

use super::{Client, IMAGE, MINUTE};

/// A workspace id of this test process.
pub fn workspace(tag: &str) -> String {
    format!("fl-{tag}-{}", std::process::id())
}

/// The runners' lease, and how often they renew it.
pub const TTL_MS: u64 = 1500;
pub const EVERY_MS: u64 = 250;

/// A `troupe-runner` process registered with a session service.
pub struct RunnerProcess {
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
    pub async fn start(name: &str, capacity: u32, service: &str, socket: &Path) -> RunnerProcess {
        let dir = tempfile::tempdir().unwrap();
        let port = troupe_tests::ports::free_addr().port();
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
            &super::tools().display().to_string(),
            "--image",
            IMAGE,
            "--uid-base",
            &super::private_uid_base().to_string(),
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
    pub async fn spawn(&mut self) {
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
    pub async fn kill(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().await.expect("kill");
    }

    pub async fn client(&self) -> Client {
        let channel = troupe_proto::endpoint::connect(&format!("http://{}", self.addr))
            .await
            .expect("connect");
        RunnerServiceClient::with_interceptor(channel, Bearer::new(Some(OPERATOR_TOKEN)).unwrap())
    }

    /// The runner's execs: `(session id, running)`.
    pub async fn execs(&self) -> Vec<(String, bool)> {
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

    pub async fn exec_ids(&self) -> Vec<String> {
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
pub struct Containers(Vec<String>);

impl Containers {
    pub fn of(runners: &[&RunnerProcess], workspaces: &[&str]) -> Containers {
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
        super::remove_containers(std::mem::take(&mut self.0));
    }
}
