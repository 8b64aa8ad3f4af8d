//! Starting a session's agent: the start request (its environment, its
//! pending messages as initial stdin), its retries while the runner is
//! unavailable, within the session's start deadline; and stopping agents.
//!
//! `RESOURCE_EXHAUSTED` fails the session `no_resources`, any other refusal
//! `lost`. A session that ended while its start was on the way has the new
//! process stopped. The messages are marked delivered only when this start
//! was the one the runner took: after `ALREADY_EXISTS` the follower's
//! delivery sends the frames, and the runner skips what it has.

use std::{collections::HashMap, sync::Arc, time::Duration};

use tonic::Code;
use troupe_proto::{
    agent::AgentEnv,
    runner::{StartExecRequest, TerminateExecRequest},
};

use super::{Driver, Job, RETRY, Term, deliver::frames, system_audit};
use crate::{
    model::{Action, Failure, RunnerName, SessionId, SessionRow},
    placement::Place,
    store::Store,
};

/// The runner refused a start: its workspace's container has no room for
/// another agent (the runner's message says why).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct NoRoom(String);

impl<S: Store> Driver<S> {
    /// Starts a new session's agent in the background, if this service owns
    /// its shard (else the shard's owner finds it in the store).
    pub fn launch(self: &Arc<Self>, session: SessionRow) {
        if let Some(term) = self.terms.of_workspace(&session.workspace_id)
            && self.has_live_runner()
        {
            self.launch_in(&term, session);
        }
    }

    /// Starts a session's agent in the background, in `term`; once at a
    /// time per session.
    pub(super) fn launch_in(self: &Arc<Self>, term: &Term, session: SessionRow) {
        if !self.claim(Job::Launch, &session.session_id) {
            return;
        }
        let driver = self.clone();
        let term = term.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = driver.launch_now(&term, &session) => {}
                () = term.cancelled() => {}
            }
            driver.release(Job::Launch, &session.session_id);
        });
    }

    async fn launch_now(self: &Arc<Self>, term: &Term, session: &SessionRow) {
        let Err(e) = self.start(term, session).await else {
            return;
        };
        // A term that ended (fenced, or past its time) leaves it to the next.
        if !term.live() {
            return;
        }
        tracing::warn!(session = %session.session_id, error = %e, "agent did not start");
        let audit = system_audit(Action::StartAgent, &session.session_id, false, &e);
        let failure = if e.is::<NoRoom>() {
            Failure::NoResources
        } else {
            Failure::Lost
        };
        let detail = format!("the agent could not be started: {e}");
        self.fail(term, &session.session_id, failure, &detail, audit)
            .await;
    }

    pub(super) async fn start(
        self: &Arc<Self>,
        term: &Term,
        session: &SessionRow,
    ) -> anyhow::Result<()> {
        let Some(runner) = self.place(term, session).await? else {
            return Ok(());
        };
        let client = self
            .runner_client(&runner)
            .await
            .ok_or_else(|| anyhow::anyhow!("runner {runner} has no usable endpoint"))?;
        let launch: crate::agents::Launch = serde_json::from_str(&session.agent_command)?;
        let started = launch.into_parts();
        let (token, _) = self.tokens.mint(&session.session_id)?;
        // A sandboxed agent is never told the id of a direct session, its
        // parent's included: the same rule as every view of the ledger.
        let parent = session
            .parent_session_id
            .as_deref()
            .zip(session.parent_trust)
            .filter(|(_, parent_trust)| crate::policy::trust_sees(session.trust, *parent_trust))
            .map(|(parent, _)| parent);
        // The definition's own variables first, Troupe's over them: a row
        // written before the checks cannot override what Troupe gives.
        let mut env: HashMap<String, String> = started
            .env
            .into_iter()
            .filter(|(name, _)| !troupe_proto::agent::env::is_reserved(name))
            .collect();
        env.extend(
            AgentEnv {
                session_id: &session.session_id,
                workspace_id: &session.workspace_id,
                trust: session.trust.to_proto(),
                tree_id: &session.tree_id,
                depth: session.depth,
                agent_name: &session.agent_name,
                parent_session_id: parent,
                token: &token,
            }
            .vars(),
        );
        // A runtime's prompt and model, for its launcher.
        env.extend(
            started
                .runtime_env
                .into_iter()
                .map(|(name, value)| (name.to_owned(), value)),
        );
        let pending = self.inbox_for(session).await?;
        let request = StartExecRequest {
            exec_id: session.session_id.to_string(),
            workspace_id: session.workspace_id.to_string(),
            command: started.command,
            env,
            initial_frames: frames(&pending),
            labels: HashMap::from([
                ("tree_id".to_owned(), session.tree_id.to_string()),
                ("depth".to_owned(), session.depth.to_string()),
            ]),
            // The agent's own spans join its tree's trace, under its life.
            traceparent: session
                .trace
                .map(|life| life.traceparent())
                .unwrap_or_default(),
            // A sandboxed row stored without a scope (older than the rule)
            // still runs in the sandboxed area.
            writable_paths: crate::policy::run_scope(session.trust, session.write_scope.clone())
                .to_strings(),
            ..Default::default()
        };
        // Whether this start's frames were queued: a start that finds the
        // exec started (by an owner before this one) leaves the messages to
        // the follower's delivery, whose frames the runner skips as far as
        // that start gave them.
        let queued = loop {
            if !term.live() {
                return Ok(());
            }
            match client
                .clone()
                .start_exec(in_life(session, request.clone()))
                .await
            {
                Ok(_) => break true,
                // Started before a restart of ours: follow it.
                Err(status) if status.code() == Code::AlreadyExists => break false,
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
                        () = term.cancelled() => return Ok(()),
                    }
                    if !self.is_active(&session.session_id).await {
                        self.ended_unstarted(term, &session.session_id).await;
                        return Ok(());
                    }
                }
                Err(status) if status.code() == Code::ResourceExhausted => {
                    return Err(NoRoom(status.message().to_owned()).into());
                }
                Err(status) => anyhow::bail!("{}", status.message()),
            }
        };
        // Ended while the start was on its way: the termination found no
        // process to stop, so stop this one.
        if !self.is_active(&session.session_id).await {
            self.stop_in(term, vec![session.session_id.clone()]);
        }
        if let Some(last) = pending.last().filter(|_| queued) {
            term.check(
                self.store
                    .mark_delivered(term.fence(), &session.session_id, last.sequence)
                    .await,
            )?;
            crate::metrics::delivered(pending.len());
        }
        self.follow(term, session.session_id.clone());
        Ok(())
    }

    /// Records the session's process on the runner placement chooses,
    /// waiting while none can take it (within its start deadline); `None`
    /// if the term or the session ended meanwhile.
    async fn place(
        self: &Arc<Self>,
        term: &Term,
        session: &SessionRow,
    ) -> anyhow::Result<Option<RunnerName>> {
        loop {
            let placed = self
                .store
                .start_process(term.fence(), &session.session_id)
                .await;
            if let Place::On(runner) = term.check(placed)? {
                return Ok(Some(runner));
            }
            let Some(left) = self.start_time_left(session) else {
                anyhow::bail!(
                    "not started within {}s of its creation: no runner could take it",
                    self.start_deadline.as_secs()
                );
            };
            tracing::info!(session = %session.session_id, "no runner can take the agent yet; waiting");
            tokio::select! {
                () = tokio::time::sleep(left.min(RETRY * 2)) => {}
                () = term.cancelled() => return Ok(None),
            }
            if !self.is_active(&session.session_id).await {
                self.ended_unstarted(term, &session.session_id).await;
                return Ok(None);
            }
        }
    }

    /// How long the session's agent may still be started, if at all.
    pub(super) fn start_time_left(&self, session: &SessionRow) -> Option<Duration> {
        let deadline = session
            .created_at_ms
            .saturating_add(i64::try_from(self.start_deadline.as_millis()).unwrap_or(i64::MAX));
        let left = deadline.saturating_sub(crate::model::now_ms());
        (left > 0).then(|| Duration::from_millis(left as u64))
    }

    /// Stops the processes of sessions of `workspace` the ledger has just
    /// ended, if this service owns its shard (else the shard's owner finds
    /// them).
    pub fn stop(self: &Arc<Self>, workspace: &str, session_ids: Vec<SessionId>) {
        if let Some(term) = self.terms.of_workspace(workspace) {
            self.stop_in(&term, session_ids);
        }
    }

    /// Stops the processes of ended sessions, in `term`, each on the runner
    /// it was placed on, and records it; one that never started has its
    /// parent's callback made due.
    pub fn stop_in(self: &Arc<Self>, term: &Term, session_ids: Vec<SessionId>) {
        self.stop_each(term, session_ids.into_iter().map(|id| (None, id)).collect());
    }

    /// Stops processes that `runner` runs for sessions that are not active
    /// (found by its reconciliation).
    pub(super) fn stop_on(self: &Arc<Self>, term: &Term, runner: &RunnerName, ids: Vec<SessionId>) {
        self.stop_each(
            term,
            ids.into_iter()
                .map(|id| (Some(runner.clone()), id))
                .collect(),
        );
    }

    fn stop_each(self: &Arc<Self>, term: &Term, stops: Vec<(Option<RunnerName>, SessionId)>) {
        let driver = self.clone();
        let term = term.clone();
        let stops: Vec<_> = stops
            .into_iter()
            .filter(|(_, id)| self.claim(Job::Stop, id))
            .collect();
        tokio::spawn(async move {
            for (runner, id) in stops {
                tokio::select! {
                    () = driver.stop_one(&term, runner, &id) => {}
                    () = term.cancelled() => {}
                }
                driver.release(Job::Stop, &id);
            }
        });
    }

    async fn stop_one(self: &Arc<Self>, term: &Term, runner: Option<RunnerName>, id: &SessionId) {
        if !term.live() {
            return;
        }
        let placed = match runner {
            Some(runner) => Some(runner),
            None => match self.store.process(id).await {
                Ok(process) => process.and_then(|p| p.runner),
                Err(_) => return,
            },
        };
        let stopped = match placed {
            // A lost runner is stopped for it when it comes back (its
            // reconciliation, or this again).
            Some(runner) if !self.is_live(&runner) => return,
            Some(runner) => match self.runner_client(&runner).await {
                Some(client) => {
                    client
                        .clone()
                        .terminate_exec(TerminateExecRequest {
                            exec_id: id.to_string(),
                            grace_ms: 0,
                        })
                        .await
                }
                None => return,
            },
            // Never placed: no runner has it.
            None => Err(tonic::Status::not_found("never placed")),
        };
        let unstarted = match stopped {
            Ok(_) => false,
            // No process, and none ever reported: its agent never started.
            Err(status) if status.code() == Code::NotFound => match self.store.process(id).await {
                Ok(process) => process.is_none_or(|p| p.runner_seq == 0),
                Err(_) => return,
            },
            Err(status) => {
                tracing::warn!(session = %id, %status, "cannot stop the agent");
                return;
            }
        };
        let marked = term.check(self.store.mark_stopped(term.fence(), id, unstarted).await);
        match marked {
            Ok(()) if unstarted => self.callback(term, id).await,
            Ok(()) => {}
            Err(e) => tracing::warn!(session = %id, error = %e, "cannot record a stop"),
        }
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
