//! Where a workspace's agents run: the placement rule, a pure function the
//! stores apply inside the transaction that records a session's process.
//!
//! A workspace stays on its runner while that runner is live (its lease
//! unexpired, or the embedded `--runner`). One whose runner is gone moves
//! once it has no active session there (those fail `runner_lost` first);
//! a new one, or one that moves, goes to the live runner with the most room
//! (capacity minus its active sessions; ties by name). With no live runner
//! the session waits, pending.

use crate::model::{RunnerName, RunnerRow};

/// What placement decided for a session about to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// Run it on this runner (and place its workspace there).
    On(RunnerName),
    /// No runner can take it now: it stays pending, and is tried again.
    Wait,
}

/// Decides where a session of a workspace starts: `current` is the
/// workspace's runner, if it has one; `busy` whether the workspace still
/// has other active sessions with a process on it; `runners` every runner
/// the store knows.
pub fn place(current: Option<&RunnerName>, busy: bool, runners: &[RunnerRow]) -> Place {
    if let Some(current) = current {
        if runners.iter().any(|r| &r.name == current && r.live) {
            return Place::On(current.clone());
        }
        if busy {
            return Place::Wait;
        }
    }
    runners
        .iter()
        .filter(|r| r.live)
        .max_by(|a, b| a.room().cmp(&b.room()).then_with(|| b.name.cmp(&a.name)))
        .map_or(Place::Wait, |r| Place::On(r.name.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runner(name: &str, capacity: u32, active: u32, live: bool) -> RunnerRow {
        RunnerRow {
            name: RunnerName::parse(name).unwrap(),
            endpoint: format!("http://{name}"),
            capacity,
            is_static: false,
            live,
            generation: 1,
            active,
        }
    }

    fn on(name: &str) -> Place {
        Place::On(RunnerName::parse(name).unwrap())
    }

    #[test]
    fn a_new_workspace_goes_to_the_live_runner_with_the_most_room() {
        let runners = [
            runner("a", 4, 3, true),
            runner("b", 8, 5, true),
            runner("c", 100, 0, false),
        ];
        assert_eq!(place(None, false, &runners), on("b"));
        // Ties go to the first name.
        let tied = [runner("b", 2, 0, true), runner("a", 3, 1, true)];
        assert_eq!(place(None, false, &tied), on("a"));
        // Full everywhere: still the one least over.
        let full = [runner("a", 1, 3, true), runner("b", 1, 2, true)];
        assert_eq!(place(None, false, &full), on("b"));
    }

    #[test]
    fn a_workspace_stays_on_its_live_runner_whatever_the_room() {
        let runners = [runner("a", 1, 1, true), runner("b", 100, 0, true)];
        let a = RunnerName::parse("a").unwrap();
        assert_eq!(place(Some(&a), true, &runners), on("a"));
        assert_eq!(place(Some(&a), false, &runners), on("a"));
    }

    #[test]
    fn a_workspace_whose_runner_is_gone_moves_only_once_it_has_no_active_session_there() {
        let runners = [runner("a", 10, 1, false), runner("b", 10, 0, true)];
        let a = RunnerName::parse("a").unwrap();
        assert_eq!(place(Some(&a), true, &runners), Place::Wait);
        assert_eq!(place(Some(&a), false, &runners), on("b"));
        // A runner the store no longer knows is gone too.
        let gone = RunnerName::parse("x").unwrap();
        assert_eq!(place(Some(&gone), false, &runners), on("b"));
    }

    #[test]
    fn without_a_live_runner_the_session_waits() {
        assert_eq!(place(None, false, &[]), Place::Wait);
        assert_eq!(place(None, false, &[runner("a", 5, 0, false)]), Place::Wait);
    }
}
