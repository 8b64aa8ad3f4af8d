//! How many execs a workspace container holds at once.
//!
//! Two limits bound processes (threads count as processes to both): the
//! container's (`--pids-limit`, its pids cgroup) and each exec's uid's
//! (`--exec-pids-limit`, `RLIMIT_NPROC`, which the supervisor sets on itself
//! before it makes anything, so its own threads count). An exec's processes
//! therefore never exceed the per-exec limit, and the runner starts an exec
//! only while
//!
//! `(execs of the workspace running or starting + 1) x per-exec limit + RESERVE`
//!
//! fits in the container's limit. The agents of a workspace together can
//! then never take what a start needs; a start beyond that is refused at
//! once, with a reason that says so, rather than made to fail inside.
//!
//! An exec counts until its exit is published, which comes after its uid
//! was killed. A start without room is `RESOURCE_EXHAUSTED`; one whose
//! agent finds no process left has its supervisor end the log with reason
//! `NO_RESOURCES`.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

/// Processes kept for the container itself: its init and main process, and
/// what `docker exec` puts in it while it starts a process.
pub const RESERVE: u64 = 32;
/// The least per-exec limit: the supervisor's threads and a few processes
/// of the agent's.
pub const MIN_EXEC_PIDS: u64 = 16;

/// The execs starting in each workspace, and the room they may take.
#[derive(Debug)]
pub struct Admission {
    container: u64,
    per_exec: u64,
    /// Execs a container holds; `None`: unlimited (no container limit).
    capacity: Option<usize>,
    starting: Mutex<HashMap<String, usize>>,
}

/// A start refused: the container has no room for another exec.
#[derive(Debug, thiserror::Error)]
#[error(
    "workspace {workspace} already runs {running} agents, as many as its container holds: \
     {container} processes (--pids-limit), {per_exec} per agent (--exec-pids-limit) and \
     {reserve} kept for the container itself"
)]
pub struct Full {
    pub workspace: String,
    pub running: usize,
    pub container: u64,
    pub per_exec: u64,
    pub reserve: u64,
}

impl Admission {
    /// The room of containers limited to `container` processes (0 or less:
    /// unlimited) for execs limited to `per_exec` each; refuses limits that
    /// leave no room for one exec.
    pub fn new(container: i64, per_exec: u64) -> anyhow::Result<Self> {
        anyhow::ensure!(
            per_exec >= MIN_EXEC_PIDS,
            "--exec-pids-limit {per_exec} is too low: an exec needs at least {MIN_EXEC_PIDS} \
             processes (its supervisor's threads and its agent)"
        );
        let container = u64::try_from(container).unwrap_or(0);
        let capacity = (container > 0).then(|| {
            usize::try_from(container.saturating_sub(RESERVE) / per_exec).unwrap_or(usize::MAX)
        });
        anyhow::ensure!(
            capacity != Some(0),
            "--pids-limit {container} has no room for one exec: it needs at least \
             {} ({per_exec} for the exec, --exec-pids-limit, and {RESERVE} for the container)",
            per_exec + RESERVE
        );
        Ok(Admission {
            container,
            per_exec,
            capacity,
            starting: Mutex::new(HashMap::new()),
        })
    }

    /// How many execs one container holds at once (`None`: no limit).
    pub fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    /// Takes room for one more exec of `workspace`, where `running` execs
    /// run; the room is counted as starting until the [`Place`] drops, by
    /// which time the exec must be counted as running (or have failed).
    pub fn admit(
        self: &Arc<Self>,
        workspace: &str,
        running: impl FnOnce() -> usize,
    ) -> Result<Place, Full> {
        let mut starting = self.starting.lock().expect("poisoned");
        let entry = starting.entry(workspace.to_owned()).or_default();
        let held = running() + *entry;
        if let Some(capacity) = self.capacity
            && held >= capacity
        {
            return Err(Full {
                workspace: workspace.to_owned(),
                running: held,
                container: self.container,
                per_exec: self.per_exec,
                reserve: RESERVE,
            });
        }
        *entry += 1;
        Ok(Place {
            admission: self.clone(),
            workspace: workspace.to_owned(),
        })
    }

    /// Execs of `workspace` being started now.
    pub fn starting(&self, workspace: &str) -> usize {
        self.starting
            .lock()
            .expect("poisoned")
            .get(workspace)
            .copied()
            .unwrap_or(0)
    }
}

/// Room held for an exec while it starts.
#[derive(Debug)]
pub struct Place {
    admission: Arc<Admission>,
    workspace: String,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut starting = self.admission.starting.lock().expect("poisoned");
        if let Some(n) = starting.get_mut(&self.workspace) {
            *n -= 1;
            if *n == 0 {
                starting.remove(&self.workspace);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_what_the_container_holds_beyond_its_reserve() {
        let admission = Arc::new(Admission::new(2 * 16 + RESERVE as i64, 16).unwrap());
        assert_eq!(admission.capacity(), Some(2));
        let first = admission.admit("w", || 0).unwrap();
        let second = admission.admit("w", || 0).unwrap();
        let full = admission.admit("w", || 0).unwrap_err();
        assert_eq!(full.running, 2);
        // Another workspace has a container of its own.
        let _other = admission.admit("v", || 0).unwrap();
        drop(first);
        // Running execs count as starting ones do.
        assert!(admission.admit("w", || 1).is_err());
        let _third = admission.admit("w", || 0).unwrap();
        drop(second);
        assert_eq!(admission.starting("w"), 1);
    }

    #[test]
    fn limits_without_room_for_one_exec_are_refused() {
        assert!(Admission::new(16 + RESERVE as i64 - 1, 16).is_err());
        assert!(Admission::new(4096, 8).is_err());
        assert_eq!(Admission::new(0, 256).unwrap().capacity(), None);
    }
}
