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
