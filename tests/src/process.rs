//! A real `troupe-session` process (the binary, as an operator runs it),
//! with its own data and workspaces directory, configured by flags and
//! environment; for what only a whole process shows: its telemetry, its
//! start and stop.

use std::{process::Stdio, time::Duration};

use tokio::process::{Child, Command};
use tonic::Request;
use troupe_proto::session::{
    self as pb, CreateRootSessionRequest, CreateSessionRequest, IssueSessionTokenRequest,
    TrustLevel,
};

use crate::{Client, OPERATOR_TOKEN};

/// A `troupe-session` process whose workspaces define the agent `worker`.
pub struct SessionProcess {
    child: Child,
    binary: String,
    pub endpoint: String,
    dir: tempfile::TempDir,
}

impl SessionProcess {
    /// Starts `binary` with `flags` and the environment `env` (the
    /// `OTEL_*` variables of the caller's own environment are cleared).
    pub fn start(binary: &str, flags: &[&str], env: &[(&str, &str)]) -> SessionProcess {
        let dir = tempfile::tempdir().unwrap();
        let agents = dir.path().join("data/agents");
        std::fs::create_dir_all(&agents).unwrap();
        std::fs::write(
            agents.join("worker.md"),
            "---\nname: worker\ndescription: test agent\ncommand: [\"/bin/cat\"]\n---\n",
        )
        .unwrap();
        SessionProcess::start_in(binary, dir, flags, env)
    }

    /// Starts `binary` on the data and workspaces of `dir`.
    pub fn start_in(
        binary: &str,
        dir: tempfile::TempDir,
        flags: &[&str],
        env: &[(&str, &str)],
    ) -> SessionProcess {
        SessionProcess::start_logging(binary, dir, flags, env, None)
    }

    /// [`SessionProcess::start_in`], its log (stderr) written to `log`
    /// instead of the test's own stderr, if given.
    pub fn start_logging(
        binary: &str,
        dir: tempfile::TempDir,
        flags: &[&str],
        env: &[(&str, &str)],
        log: Option<&std::path::Path>,
    ) -> SessionProcess {
        let port = crate::ports::free_addr().port();
        let mut command = Command::new(binary);
        command.args(["--listen", &format!("127.0.0.1:{port}")]);
        // No Unix socket unless the flags name one.
        if !flags.contains(&"--socket") {
            command.args(["--socket", "none"]);
        }
        command
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--workspaces-dir")
            .arg(dir.path().join("workspaces"))
            .args(flags)
            .env("TROUPE_OPERATOR_TOKEN", OPERATOR_TOKEN)
            .stdout(Stdio::null())
            .kill_on_drop(true);
        if let Some(log) = log {
            command.stderr(std::fs::File::create(log).expect("log file"));
        }
        for (name, _) in std::env::vars() {
            if name.starts_with("OTEL_") {
                command.env_remove(name);
            }
        }
        command.envs(env.iter().copied());
        SessionProcess {
            child: command.spawn().expect("troupe-session starts"),
            binary: binary.to_owned(),
            endpoint: format!("http://127.0.0.1:{port}"),
            dir,
        }
    }

    /// The process's id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// The CPU time the process has used so far (user and system), read
    /// from `/proc`.
    pub fn cpu_time(&self) -> Duration {
        let pid = self.child.id().expect("running");
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The fields after the command name (which may hold spaces).
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // utime and stime: fields 14 and 15 of stat, 11 and 12 after the name.
        let ticks_per_sec = 100; // USER_HZ on Linux
        Duration::from_millis((ticks(11) + ticks(12)) * 1000 / ticks_per_sec)
    }

    /// The process's resident memory (`VmRSS`), in KiB, read from `/proc`.
    pub fn rss_kib(&self) -> u64 {
        let pid = self.child.id().expect("running");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// The process's threads: the name of each (as the kernel keeps it, up
    /// to 15 bytes) and its nice value, read from `/proc`.
    pub fn threads(&self) -> Vec<(String, i32)> {
        let pid = self.child.id().expect("running");
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("/proc");
        tasks
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("stat")).ok())
            .filter_map(|stat| {
                let (head, rest) = stat.rsplit_once(')')?;
                let (_, name) = head.split_once('(')?;
                // nice is field 19 of stat, the 17th after the name.
                let nice = rest.split_whitespace().nth(16)?.parse().ok()?;
                Some((name.to_owned(), nice))
            })
            .collect()
    }

    /// A connection to the service, once it answers.
    pub async fn channel(&self) -> tonic::transport::Channel {
        let mut tries = 0;
        loop {
            match troupe_proto::endpoint::connect(&self.endpoint).await {
                Ok(channel) => return channel,
                Err(e) => {
                    tries += 1;
                    assert!(tries < 200, "the service did not come up: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// A client with `token`, on a connection of its own.
    pub async fn client(&self, token: &str) -> Client {
        let auth = troupe_proto::endpoint::Bearer::new(Some(token)).unwrap();
        pb::session_service_client::SessionServiceClient::with_interceptor(
            self.channel().await,
            auth,
        )
    }

    pub async fn operator(&self) -> Client {
        self.client(OPERATOR_TOKEN).await
    }

    /// Creates a direct root session of workspace `alpha` as the operator,
    /// in the caller's trace `traceparent` if given.
    pub async fn create_root_in(&self, traceparent: Option<&str>) -> pb::CreateRootSessionResponse {
        let mut request = Request::new(CreateRootSessionRequest {
            workspace_id: "alpha".into(),
            trust_level: TrustLevel::Direct as i32,
            agent_name: "worker".into(),
            title: "root".into(),
            ..Default::default()
        });
        if let Some(traceparent) = traceparent {
            request
                .metadata_mut()
                .insert("traceparent", traceparent.parse().unwrap());
        }
        self.operator()
            .await
            .create_root_session(request)
            .await
            .expect("create root")
            .into_inner()
    }

    /// Creates a root session; returns its id.
    pub async fn create_root(&self) -> String {
        self.create_root_in(None)
            .await
            .session
            .expect("a session")
            .session_id
    }

    /// Asks, as the operator, for a child of `parent`.
    pub async fn spawn(&self, parent: &str) -> Result<pb::Session, tonic::Status> {
        let created = self
            .operator()
            .await
            .create_session(CreateSessionRequest {
                parent_session_id: parent.into(),
                agent_name: "worker".into(),
                ..Default::default()
            })
            .await?;
        Ok(created.into_inner().session.expect("a session"))
    }

    /// Sends a message from session `from` to session `to`, with a token
    /// of `from`'s.
    pub async fn send(&self, from: &str, to: &str) {
        let token = self
            .operator()
            .await
            .issue_session_token(IssueSessionTokenRequest {
                session_id: from.into(),
            })
            .await
            .expect("token")
            .into_inner()
            .session_token;
        self.client(&token)
            .await
            .send_message(crate::message(to, format!("from {from}")))
            .await
            .expect("send");
    }

    /// Terminates `session_id` and its subtree as the operator, with `reason`.
    pub async fn terminate_session(&self, session_id: &str, reason: &str) {
        self.operator()
            .await
            .terminate_session(pb::TerminateSessionRequest {
                session_id: session_id.into(),
                reason: reason.into(),
            })
            .await
            .expect("terminate");
    }

    /// Stops the service with SIGTERM, as an operator would; true if it
    /// exited cleanly.
    pub async fn stop(self) -> bool {
        self.stop_keeping_data().await.0
    }

    /// Stops the service; returns whether it exited cleanly, and a way to
    /// start it again on the same data.
    pub async fn stop_keeping_data(mut self) -> (bool, Stopped) {
        self.terminate().await;
        let clean = self
            .exited_within(Duration::from_secs(30))
            .await
            .expect("the service stops after SIGTERM")
            .success();
        let stopped = Stopped {
            binary: self.binary,
            dir: self.dir,
        };
        (clean, stopped)
    }

    /// Sends SIGTERM, as an operator (or an orchestrator) stops a service.
    pub async fn terminate(&self) {
        let pid = self.child.id().expect("running").to_string();
        let signalled = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .unwrap();
        assert!(signalled.success());
    }

    /// Sends `signal` (`KILL`, `STOP`, `CONT`...) to the process.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("running").to_string();
        let sent = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{signal} {pid}");
    }

    /// Kills the process at once (SIGKILL): nothing of it runs after.
    pub fn kill(&self) {
        self.signal("KILL");
    }

    /// How the process exited, if it did within `limit`.
    pub async fn exited_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(limit, self.child.wait())
            .await
            .ok()
            .map(|status| status.expect("wait"))
    }

    /// The address the service listens on.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.endpoint
            .trim_start_matches("http://")
            .parse()
            .expect("an address")
    }
}

/// A stopped service's data.
pub struct Stopped {
    binary: String,
    dir: tempfile::TempDir,
}

impl Stopped {
    /// Starts the service again on its data.
    pub fn start(self, flags: &[&str], env: &[(&str, &str)]) -> SessionProcess {
        SessionProcess::start_in(&self.binary, self.dir, flags, env)
    }
}
