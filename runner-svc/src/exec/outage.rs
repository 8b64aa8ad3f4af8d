//! Execs while the Docker engine does not answer.
//!
//! - A start is refused as [`ExecError::Unavailable`], so its caller tries
//!   again later, and is refused before any uid or directory is taken.
//! - A follower cannot ask the engine whether its supervisor still runs, so
//!   it asks the host: the engine named the supervisor's host process once
//!   the supervisor ran ([`HostProcess`]); once that process is gone (killed
//!   with its container when the engine stopped), the exec ends as container
//!   lost at once. Without one, the engine decides as soon as it answers
//!   again. The host process is kept in the exec's record, so a runner
//!   started (again) while the engine is away judges the execs it recovers
//!   the same way.

use std::path::Path;

use super::{Exec, ExecError, Runner};
use crate::{
    docker::{ExecProcess, WorkspaceDirs, is_unreachable},
    layout,
    log::{Exit, Reason},
};

/// What became of an exec's process.
pub(super) enum Seen {
    /// It runs, or it cannot be told yet.
    Running,
    /// The engine says it has ended (or no longer knows it).
    Ended(ExecProcess),
    /// The engine does not answer and the process is gone from the host.
    DiedWithEngine,
}

/// What the runner knows of an exec's supervisor on the host.
#[derive(Clone, Copy, Debug, Default)]
pub(super) enum Host {
    /// Not asked yet.
    #[default]
    Unnamed,
    Named(HostProcess),
    /// The engine named none, or one this runner cannot see (another pid
    /// namespace): only the engine can tell.
    Unseen,
}

/// The exit of an exec whose supervisor died while the engine was away.
pub(super) fn died_with_engine() -> Exit {
    Exit {
        code: -1,
        reason: Reason::ContainerLost,
        detail: "the Docker engine stopped and the exec's process ended with it".into(),
    }
}

impl Runner {
    /// The workspace's running container, made if need be. An engine that
    /// does not answer makes it [`ExecError::Unavailable`].
    pub(super) async fn container_for(
        &self,
        workspace: &str,
        dirs: &WorkspaceDirs,
        busy: bool,
    ) -> Result<String, ExecError> {
        if !self.engine.is_reachable()
            && let Err(e) = self.engine.ping().await
        {
            return Err(unavailable(&e));
        }
        match self.engine.ensure_container(workspace, dirs, busy).await {
            Ok(container) => Ok(container),
            Err(e) => Err(self.start_failed(e).await),
        }
    }

    /// What a failed start reports: unavailable when the engine could not
    /// be reached (or no longer answers), internal otherwise.
    pub(super) async fn start_failed(&self, e: anyhow::Error) -> ExecError {
        if unreachable(&e) || self.engine.ping().await.is_err() {
            unavailable(&e)
        } else {
            ExecError::Internal(e)
        }
    }

    /// Asks the engine, once, for the host process of the exec's
    /// supervisor, and keeps it in the exec's record (for a runner started
    /// again while the engine is away). Called once the supervisor has
    /// written to its log: before that, the process the engine names may not
    /// be the supervisor yet.
    pub(super) async fn name_host(&self, exec: &Exec) {
        if !matches!(*exec.host.lock().expect("poisoned"), Host::Unnamed)
            || !self.engine.is_reachable()
        {
            return;
        }
        let named = match self.engine.exec_status(&exec.meta.docker_exec_id).await {
            Ok((ExecProcess::Running, Some(pid))) => {
                let dir = format!("{}/{}", layout::CONTAINER_EXECS, exec.meta.exec_id);
                match HostProcess::find(Path::new("/proc"), pid, &dir) {
                    Some(found) => Host::Named(found),
                    None => Host::Unseen,
                }
            }
            Ok(_) => Host::Unseen,
            // Asked again after the next record.
            Err(_) => return,
        };
        if let Host::Named(found) = named {
            let record =
                super::files::meta_dir(&self.settings).join(format!("{}.json", exec.meta.exec_id));
            let meta = super::Meta {
                supervisor: Some(found),
                ..exec.meta.clone()
            };
            if let Err(e) = super::files::write_meta(&record, &meta) {
                tracing::warn!(exec = %exec.meta.exec_id, error = %e, "cannot record the supervisor's host process");
            }
        }
        *exec.host.lock().expect("poisoned") = named;
    }

    /// Whether the exec's process still runs: the engine says, or, while it
    /// does not answer, the host's `/proc` does.
    pub(super) async fn observe(&self, exec: &Exec) -> anyhow::Result<Seen> {
        if self.engine.is_reachable() {
            match self.engine.exec_process(&exec.meta.docker_exec_id).await {
                Ok(ExecProcess::Running) => return Ok(Seen::Running),
                Ok(process) => return Ok(Seen::Ended(process)),
                Err(e) if !unreachable(&e) => return Err(e),
                Err(_) => {}
            }
        }
        let host = *exec.host.lock().expect("poisoned");
        Ok(match host {
            Host::Named(host) if !host.alive(Path::new("/proc")) => Seen::DiedWithEngine,
            _ => Seen::Running,
        })
    }
}

/// The host process of an exec's supervisor, as the engine named it while
/// it ran: its pid and start time (which tell it from a later process that
/// takes the same pid).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostProcess {
    pid: u32,
    start_ticks: u64,
}

impl HostProcess {
    /// The process `pid` of `proc` (a procfs), if it is the supervisor of
    /// the exec directory `dir` (as the container sees it). In another pid
    /// namespace than the engine's, `pid` is some other process or none,
    /// and nothing is found.
    pub(super) fn find(proc: &Path, pid: u32, dir: &str) -> Option<HostProcess> {
        let (state, start_ticks) = stat(proc, pid)?;
        if matches!(state, 'Z' | 'X') {
            return None;
        }
        let cmdline = std::fs::read(proc.join(pid.to_string()).join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let supervisor = args
            .first()
            .is_some_and(|a| a.ends_with(layout::SUPERVISOR.as_bytes()));
        let ours = args
            .windows(2)
            .any(|w| w[0] == b"--dir" && w[1] == dir.as_bytes());
        (supervisor && ours).then_some(HostProcess { pid, start_ticks })
    }

    /// Whether the process still runs (a zombie has ended).
    pub(super) fn alive(&self, proc: &Path) -> bool {
        matches!(stat(proc, self.pid), Some((state, ticks))
            if ticks == self.start_ticks && !matches!(state, 'Z' | 'X'))
    }
}

/// State and start time (clock ticks after boot) of a process, from
/// `/proc/<pid>/stat`.
fn stat(proc: &Path, pid: u32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(proc.join(pid.to_string()).join("stat")).ok()?;
    // The command name, in parentheses, may hold anything: fields resume
    // after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // Field 22 of the line; the state is field 3.
    let start_ticks = fields.nth(18)?.parse().ok()?;
    Some((state, start_ticks))
}

fn unreachable(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<bollard::errors::Error>())
        .any(is_unreachable)
}

fn unavailable(e: &anyhow::Error) -> ExecError {
    ExecError::Unavailable(format!("the Docker engine does not answer: {e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIR: &str = "/run/troupe/execs/sess_1";

    /// A procfs holding one process.
    fn procfs(pid: u32, state: char, ticks: u64, cmdline: &[&str]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join(pid.to_string());
        std::fs::create_dir(&dir).unwrap();
        let fields: Vec<String> = (4..22).map(|n| n.to_string()).collect();
        std::fs::write(
            dir.join("stat"),
            format!(
                "{pid} (odd) name) {state} {} {ticks} 0 0\n",
                fields.join(" ")
            ),
        )
        .unwrap();
        std::fs::write(dir.join("cmdline"), cmdline.join("\0") + "\0").unwrap();
        root
    }

    fn supervisor_of(dir: &str) -> Vec<&str> {
        vec![
            "/opt/troupe/bin/troupe-supervisor",
            "run",
            "--dir",
            dir,
            "--",
            "sh",
        ]
    }

    #[test]
    fn the_supervisor_is_found_and_its_end_seen() {
        let proc = procfs(42, 'S', 777, &supervisor_of(DIR));
        let host = HostProcess::find(proc.path(), 42, DIR).expect("found");
        assert!(host.alive(proc.path()));
        let zombie = procfs(42, 'Z', 777, &supervisor_of(DIR));
        assert!(!host.alive(zombie.path()));
        let reused = procfs(42, 'S', 778, &supervisor_of(DIR));
        assert!(!host.alive(reused.path()));
        let gone = tempfile::tempdir().unwrap();
        assert!(!host.alive(gone.path()));
    }

    #[test]
    fn another_process_under_the_pid_is_not_taken_for_the_supervisor() {
        let other_exec = procfs(42, 'S', 777, &supervisor_of("/run/troupe/execs/sess_2"));
        assert_eq!(HostProcess::find(other_exec.path(), 42, DIR), None);
        let other = procfs(42, 'S', 777, &["sleep", "--dir", DIR]);
        assert_eq!(HostProcess::find(other.path(), 42, DIR), None);
        let zombie = procfs(42, 'Z', 777, &supervisor_of(DIR));
        assert_eq!(HostProcess::find(zombie.path(), 42, DIR), None);
        assert_eq!(HostProcess::find(other.path(), 43, DIR), None);
    }
}
