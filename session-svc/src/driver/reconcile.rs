//! The pass at start: what to do with each active session the ledger holds,
//! given what the runner reports of its exec, and with each exec the runner
//! runs for a session that is no longer active.

use std::{collections::HashSet, sync::Arc};

use troupe_proto::{
    runner::{self as rpb, ListExecsRequest},
    session::SessionStatus,
};

use super::{Driver, RETRY, system_audit};
use crate::{
    model::{Failure, ProcessRow},
    store::Store,
};

/// What the reconciler does with an active session created before this
/// driver started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Decision {
    /// The runner runs (or ran) its exec: follow its events.
    Follow,
    /// Its agent never started: start it now.
    Start {
        /// Whether its parent is told of its end (CALLBACK mode).
        notify_parent: bool,
    },
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
        (false, None) => Decision::Start {
            notify_parent: false,
        },
        // Its start was still being retried (the runner was down): no event
        // of it ever came, so start it now.
        (false, Some(process)) if process.runner_seq == 0 && status == SessionStatus::Pending => {
            Decision::Start {
                notify_parent: process.notify_parent,
            }
        }
        (false, Some(_)) => Decision::Fail,
    }
}

/// The runner's running execs whose session is not active: they are stopped.
pub(super) fn orphans(execs: &[rpb::ExecInfo], active_ids: &HashSet<&str>) -> Vec<String> {
    execs
        .iter()
        .filter(|e| {
            e.state() == rpb::ExecState::Running && !active_ids.contains(e.exec_id.as_str())
        })
        .map(|e| e.exec_id.clone())
        .collect()
}

impl<S: Store> Driver<S> {
    /// After a restart: follows the agents that still run, starts those that
    /// never did, fails the sessions whose process is gone and stops the
    /// processes whose session has ended. Retries until the runner answers.
    pub async fn reconcile(self: Arc<Self>) {
        loop {
            match self.reconcile_once().await {
                Ok(()) => return,
                Err(e) => tracing::info!(error = %e, "runner not reachable yet; retrying"),
            }
            tokio::select! {
                () = tokio::time::sleep(RETRY * 4) => {}
                () = self.shutdown.cancelled() => return,
            }
        }
    }

    pub(super) async fn reconcile_once(self: &Arc<Self>) -> anyhow::Result<()> {
        let execs = self
            .runner
            .clone()
            .list_execs(ListExecsRequest::default())
            .await?
            .into_inner()
            .execs;
        let known: HashSet<&str> = execs.iter().map(|e| e.exec_id.as_str()).collect();
        let active = self.store.active_sessions().await?;
        let active_ids: HashSet<&str> = active.iter().map(|s| s.session_id.as_str()).collect();
        for session in &active {
            if session.created_at_ms >= self.started_at_ms {
                continue;
            }
            let process = self.store.process(&session.session_id).await?;
            let runner_knows = known.contains(session.session_id.as_str());
            match decide(session.status, runner_knows, process.as_ref()) {
                Decision::Follow => self.follow(session.session_id.clone()),
                Decision::Start { notify_parent } => self.launch(session.clone(), notify_parent),
                Decision::Fail => {
                    let detail = "its process is gone (the runner does not know it)";
                    let audit = system_audit("reconcile", &session.session_id, true, &detail);
                    self.fail(&session.session_id, Failure::Lost, detail, audit)
                        .await;
                }
            }
        }
        let orphans = orphans(&execs, &active_ids);
        for id in &orphans {
            let audit = system_audit(
                "reconcile",
                id,
                true,
                &"stopping a process whose session is not active",
            );
            self.store.append_audit(audit).await?;
        }
        if !orphans.is_empty() {
            self.stop(orphans);
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
    fn a_session_without_a_process_record_is_started_without_a_callback() {
        for status in [SessionStatus::Pending, SessionStatus::Running] {
            assert_eq!(
                decide(status, false, None),
                Decision::Start {
                    notify_parent: false
                }
            );
        }
    }

    #[test]
    fn a_pending_session_whose_start_was_being_retried_is_started_with_its_callback() {
        for notify_parent in [false, true] {
            assert_eq!(
                decide(
                    SessionStatus::Pending,
                    false,
                    Some(&process(0, notify_parent))
                ),
                Decision::Start { notify_parent }
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
        assert_eq!(orphans(&execs, &active), ["sess_ended", "sess_gone"]);
        let all = HashSet::from(["sess_active", "sess_ended", "sess_exited", "sess_gone"]);
        assert!(orphans(&execs, &all).is_empty());
        assert!(orphans(&[], &active).is_empty());
    }
}
