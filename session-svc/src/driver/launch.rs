//! Starting a session's agent: the start request (its environment, its
//! pending messages as initial stdin), its retries while the runner is
//! unavailable, within the session's start deadline; and stopping agents.

use std::{collections::HashMap, sync::Arc, time::Duration};

use tonic::Code;
use troupe_proto::{
    agent::AgentEnv,
    runner::{StartExecRequest, TerminateExecRequest},
};

use super::{Driver, RETRY, deliver::lines, system_audit};
use crate::{
    model::{Failure, SessionRow},
    store::Store,
};

/// The runner refused a start: its workspace's container has no room for
/// another agent (the runner's message says why).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct NoRoom(String);

impl<S: Store> Driver<S> {
    /// Starts a new session's agent in the background.
    pub fn launch(self: &Arc<Self>, session: SessionRow, notify_parent: bool) {
        let driver = self.clone();
        tokio::spawn(async move {
            if let Err(e) = driver.start(&session, notify_parent).await {
                tracing::warn!(session = %session.session_id, error = %e, "agent did not start");
                let audit = system_audit("start_agent", &session.session_id, false, &e);
                let failure = if e.is::<NoRoom>() {
                    Failure::NoResources
                } else {
                    Failure::Lost
                };
                let detail = format!("the agent could not be started: {e}");
                driver
                    .fail(&session.session_id, failure, &detail, audit)
                    .await;
            }
        });
    }

    pub(super) async fn start(
        self: &Arc<Self>,
        session: &SessionRow,
        notify_parent: bool,
    ) -> anyhow::Result<()> {
        self.store
            .start_process(&session.session_id, notify_parent)
            .await?;
        let command: Vec<String> = serde_json::from_str(&session.agent_command)?;
        let (token, _) = self.tokens.mint(&session.session_id)?;
        // A sandboxed agent is never told the id of a direct session, its
        // parent's included: the same rule as every view of the ledger.
        let parent = session
            .parent_session_id
            .as_deref()
            .zip(session.parent_trust)
            .filter(|(_, parent_trust)| crate::policy::trust_sees(session.trust, *parent_trust))
            .map(|(parent, _)| parent);
        let env = AgentEnv {
            session_id: &session.session_id,
            workspace_id: &session.workspace_id,
            trust: session.trust.to_proto(),
            tree_id: &session.tree_id,
            depth: session.depth,
            agent_name: &session.agent_name,
            parent_session_id: parent,
            token: &token,
        }
        .vars();
        let pending = self.inbox_for(session).await?;
        let request = StartExecRequest {
            exec_id: session.session_id.clone(),
            workspace_id: session.workspace_id.clone(),
            command,
            env,
            initial_stdin: lines(&pending),
            labels: HashMap::from([
                ("tree_id".to_owned(), session.tree_id.clone()),
                ("depth".to_owned(), session.depth.to_string()),
            ]),
            // The agent's own spans join its tree's trace, under its life.
            traceparent: session
                .trace
                .map(|life| life.traceparent())
                .unwrap_or_default(),
            ..Default::default()
        };
        loop {
            match self
                .runner
                .clone()
                .start_exec(in_life(session, request.clone()))
                .await
            {
                Ok(_) => break,
                // Started before a restart of ours: follow it.
                Err(status) if status.code() == Code::AlreadyExists => break,
                // The runner (or its engine) is down: the session stays
                // pending until it is back, or until its start deadline.
                Err(status) if status.code() == Code::Unavailable => {
                    let Some(left) = self.start_time_left(session) else {
                        anyhow::bail!(
                            "not started within {}s of its creation: the runner is unavailable ({})",
                            self.start_deadline.as_secs(),
                            status.message()
                        );
                    };
                    tracing::info!(session = %session.session_id, %status, "runner unavailable; retrying the start");
                    tokio::select! {
                        () = tokio::time::sleep(left.min(RETRY * 4)) => {}
                        () = self.shutdown.cancelled() => return Ok(()),
                    }
                    if !self.is_active(&session.session_id).await {
                        self.ended_unstarted(&session.session_id).await;
                        return Ok(());
                    }
                }
                Err(status) if status.code() == Code::ResourceExhausted => {
                    return Err(NoRoom(status.message().to_owned()).into());
                }
                Err(status) => anyhow::bail!("{}", status.message()),
            }
        }
        // Ended while the start was on its way: the termination found no
        // process to stop, so stop this one.
        if !self.is_active(&session.session_id).await {
            self.stop(vec![session.session_id.clone()]);
        }
        if let Some(last) = pending.last() {
            self.store
                .mark_delivered(&session.session_id, last.sequence)
                .await?;
            crate::metrics::delivered(pending.len());
        }
        self.follow(session.session_id.clone());
        Ok(())
    }

    /// How long the session's agent may still be started, if at all.
    pub(super) fn start_time_left(&self, session: &SessionRow) -> Option<Duration> {
        let deadline = session
            .created_at_ms
            .saturating_add(i64::try_from(self.start_deadline.as_millis()).unwrap_or(i64::MAX));
        let left = deadline.saturating_sub(crate::model::now_ms());
        (left > 0).then(|| Duration::from_millis(left as u64))
    }

    /// Stops the processes of sessions the ledger has just ended.
    pub fn stop(self: &Arc<Self>, session_ids: Vec<String>) {
        let driver = self.clone();
        tokio::spawn(async move {
            for id in session_ids {
                let stopped = driver
                    .runner
                    .clone()
                    .terminate_exec(TerminateExecRequest {
                        exec_id: id.clone(),
                        grace_ms: 0,
                    })
                    .await;
                match stopped {
                    Ok(_) => {}
                    // No process, and none ever reported: its agent never started.
                    Err(status) if status.code() == Code::NotFound => {
                        let unstarted = matches!(
                            driver.store.process(&id).await,
                            Ok(Some(p)) if p.runner_seq == 0
                        );
                        if unstarted {
                            driver.ended_unstarted(&id).await;
                        }
                    }
                    Err(status) => {
                        tracing::warn!(session = %id, %status, "cannot stop the agent")
                    }
                }
            }
        });
    }
}

/// A runner call in the session's trace: under its life span, when it has
/// one, so the runner's span of the call sits in the tree.
fn in_life<T>(session: &SessionRow, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(value) = session
        .trace
        .and_then(|life| life.traceparent().parse().ok())
    {
        request.metadata_mut().insert("traceparent", value);
    }
    request
}
