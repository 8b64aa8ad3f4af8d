//! A Docker engine of the test's own, for tests that stop one (the shared
//! engine others use must never stop): `dockerd` with its socket, data-root
//! and exec-root in a temporary directory, holding the workspace image
//! copied from the shared engine. Dropped, it is stopped, whatever happened.

use std::{
    fs::File,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use super::IMAGE;

/// Longest wait for `dockerd` to answer, or to stop.
const PATIENCE: Duration = Duration::from_secs(30);

pub struct PrivateEngine {
    dir: tempfile::TempDir,
    dockerd: Option<Child>,
}

impl PrivateEngine {
    /// Starts a `dockerd` and loads the workspace image into it.
    pub async fn start() -> PrivateEngine {
        super::require_engine();
        // Short: the socket's path must fit in a sockaddr_un.
        let dir = tempfile::Builder::new()
            .prefix("troupe-engine.")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let mut engine = PrivateEngine { dir, dockerd: None };
        engine.start_again().await;
        engine.load_image();
        engine
    }

    /// Its `DOCKER_HOST`.
    pub fn host(&self) -> String {
        format!("unix://{}", self.path("docker.sock").display())
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts `dockerd` (again, on the same data) and waits for its `/_ping`.
    pub async fn start_again(&mut self) {
        assert!(self.dockerd.is_none(), "dockerd already runs");
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.path("dockerd.log"))
            .expect("dockerd log");
        let spawned = Command::new("dockerd")
            .arg("--host")
            .arg(self.host())
            .arg("--data-root")
            .arg(self.path("data"))
            .arg("--exec-root")
            .arg(self.path("exec"))
            .arg("--pidfile")
            .arg(self.path("dockerd.pid"))
            .args(["--iptables=false", "--bridge=none"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dockerd log"))
            .stderr(log)
            .spawn();
        self.dockerd = Some(match spawned {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                "this test runs a Docker engine of its own, and dockerd is not on PATH: \
                 install docker.io (scripts/test does)"
            ),
            Err(e) => panic!("cannot start dockerd: {e}"),
        });
        let deadline = Instant::now() + PATIENCE;
        loop {
            // The client checks that the socket exists: made anew each time.
            if let Ok(docker) = bollard::Docker::connect_with_host(&self.host())
                && docker.ping().await.is_ok()
            {
                return;
            }
            let child = self.dockerd.as_mut().expect("dockerd");
            if let Some(status) = child.try_wait().expect("dockerd status") {
                self.dockerd = None;
                panic!("dockerd exited at start ({status}):\n{}", self.log_tail());
            }
            assert!(
                Instant::now() < deadline,
                "dockerd did not answer within {PATIENCE:?}:\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Freezes `dockerd` (SIGSTOP): it still accepts connections, as the
    /// kernel does for it, and answers nothing; its containers run on.
    pub fn hang(&self) {
        signal(
            self.dockerd.as_ref().expect("dockerd runs"),
            Signal::SIGSTOP,
        );
    }

    /// Lets a frozen `dockerd` go on (SIGCONT).
    pub fn resume(&self) {
        signal(
            self.dockerd.as_ref().expect("dockerd runs"),
            Signal::SIGCONT,
        );
    }

    /// Stops `dockerd` as a service manager does (SIGTERM) and waits until
    /// it is gone; its containers are stopped with it.
    pub async fn stop(&mut self) {
        let Some(mut child) = self.dockerd.take() else {
            return;
        };
        signal(&child, Signal::SIGCONT);
        signal(&child, Signal::SIGTERM);
        let deadline = Instant::now() + PATIENCE;
        while child.try_wait().expect("dockerd status").is_none() {
            if Instant::now() >= deadline {
                signal(&child, Signal::SIGKILL);
                let _ = child.wait();
                panic!("dockerd ignored SIGTERM for {PATIENCE:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Copies the workspace image from the shared engine.
    fn load_image(&self) {
        let mut save = Command::new("docker")
            .args(["save", IMAGE])
            .stdout(Stdio::piped())
            .spawn()
            .expect("the docker CLI (docker.io) is needed to copy the image");
        let load = Command::new("docker")
            .arg("--host")
            .arg(self.host())
            .arg("load")
            .stdin(save.stdout.take().expect("piped"))
            .output()
            .expect("docker load");
        let saved = save.wait().expect("docker save");
        assert!(
            saved.success() && load.status.success(),
            "cannot copy {IMAGE} into the private engine (build it with scripts/build-image): {}",
            String::from_utf8_lossy(&load.stderr)
        );
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.path("dockerd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for PrivateEngine {
    fn drop(&mut self) {
        let Some(mut child) = self.dockerd.take() else {
            return;
        };
        signal(&child, Signal::SIGCONT);
        signal(&child, Signal::SIGTERM);
        let deadline = Instant::now() + PATIENCE;
        while matches!(child.try_wait(), Ok(None)) {
            if Instant::now() >= deadline {
                signal(&child, Signal::SIGKILL);
                let _ = child.wait();
                // A killed dockerd leaves its mounts behind, which would
                // keep the directory from being removed.
                let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
                let mut ours: Vec<&str> = mounts
                    .lines()
                    .filter_map(|line| line.split(' ').nth(1))
                    .filter(|at| at.starts_with(&*self.dir.path().to_string_lossy()))
                    .collect();
                ours.sort_by_key(|at| std::cmp::Reverse(at.len()));
                for at in ours {
                    let _ = Command::new("umount").arg("-l").arg(at).status();
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn signal(child: &Child, signal: Signal) {
    let _ = kill(Pid::from_raw(child.id() as i32), signal);
}
