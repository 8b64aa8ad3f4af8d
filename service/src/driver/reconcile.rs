//! The pass per runner, for the terms of shards it has not yet been
//! reconciled in (new terms, or the runner registered anew): what to do
//! with each active session of those shards placed on it, given what the
//! runner reports of its exec, and with each exec of those shards the
//! runner runs for a session that is no longer active (stopped, unless the
//! session finished its task and its grace is not over). `decide` (follow,
//! start or fail a session), `orphans` (the execs to stop) and
//! `in_finish_grace` are pure functions.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use troupe_proto::{
    runner::{self as rpb, ListExecsRequest},
    session::SessionStatus,
};

use super::{Driver, Job, Term, system_audit};
use crate::{
    model::{Action, Failure, ProcessRow, RunnerName, SessionId, now_ms},
    shard::Shard,
    store::Store,
};

/// What the reconciler does with an active session (every one: a new
/// owner takes over sessions whatever service created them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Decision {
    /// The runner runs (or ran) its exec: follow its events from the last
    /// one applied.
    Follow,
    /// Its agent never started: start it now (with its CALLBACK choice,
    /// which the session row keeps).
    Start,
    /// Its process is gone: fail the session as lost.
    Fail,
}

/// The reconciler's decision for an active session, from its status, whether
/// the runner knows its exec, and its process record, if any.
pub(super) fn decide(
    status: SessionStatus,
    runner_knows: bool,
    process: Option<&ProcessRow>,
) -> Decision {
    match (runner_knows, process) {
        (true, _) => Decision::Follow,
        (false, None) => Decision::Start,
        // Its start was still being retried (the runner was down), or its
        // owner died between the record and the runner's answer: no event
        // of it ever came, so start it now.
        (false, Some(process)) if process.runner_seq == 0 && status == SessionStatus::Pending => {
            Decision::Start
        }
        (false, Some(_)) => Decision::Fail,
    }
}

/// The runner's running execs whose session is not active, with their
/// workspace's shard: they are stopped (by that shard's owner).
pub(super) fn orphans(
    execs: &[rpb::ExecInfo],
    active_ids: &HashSet<&str>,
) -> Vec<(Shard, SessionId)> {
    execs
        .iter()
        .filter(|e| {
            e.state() == rpb::ExecState::Running && !active_ids.contains(e.exec_id.as_str())
        })
        .map(|e| (Shard::of(&e.workspace_id), SessionId::from(&e.exec_id)))
        .collect()
}

/// Whether a process is within the grace its session's finish gave it.
pub(super) fn in_finish_grace(process: &ProcessRow, now_ms: i64) -> bool {
    process.exit_code.is_none() && process.stop_after_ms.is_some_and(|at| at > now_ms)
}

impl<S: Store> Driver<S> {
    /// Reconciles one runner for the shards of `terms` (new terms, or the
    /// runner registered anew): follows the agents of those shards placed
    /// on it that still run, starts those that never did, fails the
    /// sessions whose process is gone and stops the processes whose session
    /// has ended.
    pub(super) async fn reconcile_runner(
        self: &Arc<Self>,
        terms: &[Term],
        runner: &RunnerName,
    ) -> anyhow::Result<()> {
        let terms: HashMap<Shard, &Term> = terms.iter().map(|t| (t.fence().shard, t)).collect();
        let client = self
            .runner_client(runner)
            .await
            .ok_or_else(|| anyhow::anyhow!("runner {runner} has no usable endpoint"))?;
        let execs = client
            .clone()
            .list_execs(ListExecsRequest::default())
            .await?
            .into_inner()
            .execs;
        let known: HashSet<&str> = execs.iter().map(|e| e.exec_id.as_str()).collect();
        let active = self.store.active_sessions().await?;
        let active_ids: HashSet<&str> = active.iter().map(|s| s.session_id.as_str()).collect();
        for session in &active {
            let Some(term) = terms.get(&Shard::of(&session.workspace_id)).copied() else {
                continue;
            };
            let process = self.store.process(&session.session_id).await?;
            // Sessions placed elsewhere are their runner's; those not placed
            // yet are launched as the store's work.
            if process.as_ref().and_then(|p| p.runner.as_ref()) != Some(runner) {
                continue;
            }
            let runner_knows = known.contains(session.session_id.as_str());
            match decide(session.status, runner_knows, process.as_ref()) {
                Decision::Follow => self.follow(term, session.session_id.clone()),
                Decision::Start => self.launch_in(term, session.clone()),
                Decision::Fail => {
                    // A start of this term may be on its way.
                    if !self.claim(Job::Launch, &session.session_id) {
                        continue;
                    }
                    let detail = "its process is gone (the runner does not know it)";
                    let audit = system_audit(Action::Reconcile, &session.session_id, true, &detail);
                    self.fail(term, &session.session_id, Failure::Lost, detail, audit)
                        .await;
                    self.release(Job::Launch, &session.session_id);
                }
            }
        }
        let mut orphans: Vec<(Shard, SessionId)> = orphans(&execs, &active_ids)
            .into_iter()
            .filter(|(shard, _)| terms.contains_key(shard))
            .collect();
        // A session that finished its task keeps its process for the
        // finish's grace: the store's work stops it once that is over.
        let mut in_grace = HashSet::new();
        for (_, id) in &orphans {
            let process = self.store.process(id).await?;
            if process.is_some_and(|p| in_finish_grace(&p, now_ms())) {
                in_grace.insert(id.clone());
            }
        }
        orphans.retain(|(_, id)| !in_grace.contains(id));
        for (_, id) in &orphans {
            let audit = system_audit(
                Action::Reconcile,
                id,
                true,
                &format!("stopping a process on runner {runner} whose session is not active"),
            );
            self.store.append_audit(audit).await?;
        }
        let mut by_shard: HashMap<Shard, Vec<SessionId>> = HashMap::new();
        for (shard, id) in orphans {
            by_shard.entry(shard).or_default().push(id);
        }
        for (shard, ids) in by_shard {
            self.stop_on(terms[&shard], runner, ids);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(runner_seq: u64, notify_parent: bool) -> ProcessRow {
        ProcessRow {
            runner_seq,
            notify_parent,
            ..ProcessRow::default()
        }
    }

    #[test]
    fn a_session_whose_exec_the_runner_knows_is_followed() {
        for status in [SessionStatus::Pending, SessionStatus::Running] {
            assert_eq!(decide(status, true, None), Decision::Follow);
            assert_eq!(
                decide(status, true, Some(&process(0, true))),
                Decision::Follow
            );
            assert_eq!(
                decide(status, true, Some(&process(7, false))),
                Decision::Follow
            );
        }
    }

    #[test]
    fn a_session_without_a_process_record_is_started() {
        for status in [SessionStatus::Pending, SessionStatus::Running] {
            assert_eq!(decide(status, false, None), Decision::Start);
        }
    }

    #[test]
    fn a_pending_session_whose_start_was_being_retried_is_started() {
        for notify_parent in [false, true] {
            assert_eq!(
                decide(
                    SessionStatus::Pending,
                    false,
                    Some(&process(0, notify_parent))
                ),
                Decision::Start
            );
        }
    }

    #[test]
    fn a_session_whose_process_the_runner_lost_fails() {
        // It reported events, so it ran.
        assert_eq!(
            decide(SessionStatus::Pending, false, Some(&process(3, true))),
            Decision::Fail
        );
        assert_eq!(
            decide(SessionStatus::Running, false, Some(&process(3, false))),
            Decision::Fail
        );
        // Running, so it started, even if no event of it was applied.
        assert_eq!(
            decide(SessionStatus::Running, false, Some(&process(0, true))),
            Decision::Fail
        );
    }

    fn exec(id: &str, state: rpb::ExecState) -> rpb::ExecInfo {
        let mut info = rpb::ExecInfo {
            exec_id: id.to_owned(),
            ..Default::default()
        };
        info.set_state(state);
        info
    }

    #[test]
    fn only_running_execs_of_inactive_sessions_are_stopped() {
        let execs = [
            exec("sess_active", rpb::ExecState::Running),
            exec("sess_ended", rpb::ExecState::Running),
            exec("sess_exited", rpb::ExecState::Exited),
            exec("sess_gone", rpb::ExecState::Running),
        ];
        let active = HashSet::from(["sess_active", "sess_exited"]);
        let ids: Vec<SessionId> = orphans(&execs, &active)
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        assert_eq!(ids, ["sess_ended", "sess_gone"]);
        let all = HashSet::from(["sess_active", "sess_ended", "sess_exited", "sess_gone"]);
        assert!(orphans(&execs, &all).is_empty());
        assert!(orphans(&[], &active).is_empty());
    }

    #[test]
    fn a_finished_process_is_kept_until_its_grace_is_over() {
        let finished = |stop_after_ms, exit_code| ProcessRow {
            stop_after_ms,
            exit_code,
            ..ProcessRow::default()
        };
        assert!(in_finish_grace(&finished(Some(2_000), None), 1_000));
        assert!(!in_finish_grace(&finished(Some(2_000), None), 2_000));
        assert!(!in_finish_grace(&finished(Some(2_000), Some(0)), 1_000));
        assert!(!in_finish_grace(&finished(None, None), 1_000));
    }
}
