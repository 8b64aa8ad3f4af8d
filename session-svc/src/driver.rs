//! The session service's side of the runner (`troupe.runner.v1`): it starts
//! each session's agent, follows the agent's events into the ledger, writes
//! messages to its stdin, stops its process when the session is terminated,
//! and reconciles the two after a restart of either.
//!
//! The ledger stays the authority: the driver only reports what the runner
//! saw (through [`Store::record_process`], which applies each runner event
//! once, by its sequence), and asks the runner to act on what the ledger
//! decided.
//!
//! An agent's stdin receives one JSON line per message, its initial message
//! first:
//! `{"type":"message","sequence":1,"message_id":"msg_...","sender":"session:sess_...","message":"..."}`.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status, service::interceptor::InterceptedService, transport::Channel};
use troupe_proto::{
    endpoint::Bearer,
    runner::{
        self as rpb, ListExecsRequest, StartExecRequest, TerminateExecRequest, WatchExecRequest,
        WriteStdinRequest, exec_event, runner_service_client::RunnerServiceClient,
    },
};

use crate::{
    auth::Tokens,
    error::SessionError,
    model::{
        AuditRecord, Failure, Idempotency, InboxMessage, NewMessage, ProcessChange, ProcessExit,
        SessionRow,
    },
    store::Store,
};

/// The runner refused a start: its workspace's container has no room for
/// another agent (the runner's message says why).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct NoRoom(String);

/// How long a lost runner connection waits before it is tried again.
const RETRY: Duration = Duration::from_millis(500);

type Client = RunnerServiceClient<InterceptedService<Channel, Bearer>>;

/// Drives agents through the runner.
pub struct Driver<S> {
    store: S,
    tokens: Arc<Tokens>,
    runner: Client,
    tail_max: usize,
    /// How long after its creation a session's agent may still be started.
    start_deadline: Duration,
    /// Serialises stdin delivery per session, so messages keep their order.
    delivering: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Sessions whose events are being followed.
    following: Mutex<HashSet<String>>,
    /// When this driver started: sessions created since are launched by
    /// this process, and reconciliation leaves them alone.
    started_at_ms: i64,
    shutdown: CancellationToken,
}

impl<S: Store> Driver<S> {
    pub fn new(
        store: S,
        tokens: Arc<Tokens>,
        channel: Channel,
        operator_token: &str,
        tail_max: usize,
        start_deadline: Duration,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Arc<Self>> {
        let auth = Bearer::new(Some(operator_token))?;
        Ok(Arc::new(Driver {
            store,
            tokens,
            runner: RunnerServiceClient::with_interceptor(channel, auth)
                .max_decoding_message_size(16 << 20),
            tail_max,
            start_deadline,
            delivering: Mutex::new(HashMap::new()),
            following: Mutex::new(HashSet::new()),
            started_at_ms: crate::model::now_ms(),
            shutdown,
        }))
    }

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

    async fn start(
        self: &Arc<Self>,
        session: &SessionRow,
        notify_parent: bool,
    ) -> anyhow::Result<()> {
        self.store
            .start_process(&session.session_id, notify_parent)
            .await?;
        let command: Vec<String> = serde_json::from_str(&session.agent_command)?;
        let (token, _) = self.tokens.mint(&session.session_id)?;
        let mut env = HashMap::from([
            ("TROUPE_SESSION_ID".to_owned(), session.session_id.clone()),
            (
                "TROUPE_WORKSPACE_ID".to_owned(),
                session.workspace_id.clone(),
            ),
            (
                "TROUPE_TRUST_LEVEL".to_owned(),
                session.trust.as_str().to_owned(),
            ),
            ("TROUPE_TREE_ID".to_owned(), session.tree_id.clone()),
            ("TROUPE_DEPTH".to_owned(), session.depth.to_string()),
            ("TROUPE_AGENT_NAME".to_owned(), session.agent_name.clone()),
            ("TROUPE_SESSION_TOKEN".to_owned(), token),
        ]);
        // A sandboxed agent is never told the id of a direct session, its
        // parent's included: the same rule as every view of the ledger.
        if let (Some(parent), Some(parent_trust)) =
            (&session.parent_session_id, session.parent_trust)
            && crate::policy::trust_sees(session.trust, parent_trust)
        {
            env.insert("TROUPE_PARENT_SESSION_ID".to_owned(), parent.clone());
        }
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
                .mark_delivered(&session.session_id, last.seq)
                .await?;
            crate::metrics::delivered(pending.len());
        }
        self.follow(session.session_id.clone());
        Ok(())
    }

    /// How long the session's agent may still be started, if at all.
    fn start_time_left(&self, session: &SessionRow) -> Option<Duration> {
        let deadline = session
            .created_at_ms
            .saturating_add(i64::try_from(self.start_deadline.as_millis()).unwrap_or(i64::MAX));
        let left = deadline.saturating_sub(crate::model::now_ms());
        (left > 0).then(|| Duration::from_millis(left as u64))
    }

    /// The messages not yet written to `recipient`'s agent, as it may see
    /// them: a sandboxed agent is never told a direct session's id, so such
    /// a sender reads `session`, as in every view of the ledger.
    async fn inbox_for(&self, recipient: &SessionRow) -> Result<Vec<InboxMessage>, SessionError> {
        let mut pending = self.store.undelivered(&recipient.session_id).await?;
        for m in &mut pending {
            let Some(sender) = m.sender.strip_prefix("session:") else {
                continue;
            };
            let visible = match self.store.get_session(sender).await? {
                Some(row) => crate::policy::trust_sees(recipient.trust, row.trust),
                None => false,
            };
            if !visible {
                m.sender = "session".to_owned();
            }
        }
        Ok(pending)
    }

    /// Whether the session is still pending or running (assumed so when the
    /// ledger cannot be read: the next check decides).
    async fn is_active(&self, session_id: &str) -> bool {
        !matches!(self.store.get_session(session_id).await, Ok(Some(row)) if !row.is_active())
    }

    /// Follows a session's runner events into the ledger, in the background,
    /// from the last one applied.
    fn follow(self: &Arc<Self>, session_id: String) {
        if !self
            .following
            .lock()
            .expect("poisoned")
            .insert(session_id.clone())
        {
            return;
        }
        let driver = self.clone();
        tokio::spawn(async move {
            driver.follow_until_exit(&session_id).await;
            driver
                .following
                .lock()
                .expect("poisoned")
                .remove(&session_id);
        });
    }

    async fn follow_until_exit(self: &Arc<Self>, session_id: &str) {
        loop {
            match self.follow_once(session_id).await {
                Ok(true) => return,
                Ok(false) => {}
                Err(status) if status.code() == Code::NotFound => {
                    let detail = "the runner has no process for this session";
                    let audit = system_audit("reconcile", session_id, true, &detail);
                    self.fail(session_id, Failure::Lost, detail, audit).await;
                    return;
                }
                Err(status) => {
                    tracing::debug!(session = session_id, %status, "runner watch interrupted");
                }
            }
            tokio::select! {
                () = tokio::time::sleep(RETRY) => {}
                () = self.shutdown.cancelled() => return,
            }
        }
    }

    /// One watch of the runner's events; true once the exit was applied.
    async fn follow_once(self: &Arc<Self>, session_id: &str) -> Result<bool, Status> {
        let after = self
            .store
            .process(session_id)
            .await
            .map_err(internal)?
            .map_or(0, |p| p.runner_seq);
        let mut stream = self
            .runner
            .clone()
            .watch_exec(WatchExecRequest {
                exec_id: session_id.to_owned(),
                after_sequence: after,
            })
            .await?
            .into_inner();
        // The runner answers again (after a restart of either side, or a
        // lost connection): what could not be written meanwhile goes now.
        self.deliver(session_id).await;
        loop {
            let event = tokio::select! {
                event = stream.next() => event,
                () = self.shutdown.cancelled() => return Ok(true),
            };
            let Some(event) = event.transpose()? else {
                return Ok(false);
            };
            let Some(change) = change(&event) else {
                continue;
            };
            let exited = matches!(change, ProcessChange::Exited(_));
            let started = change == ProcessChange::Started;
            let applied = self
                .store
                .record_process(session_id, event.sequence, change.clone(), self.tail_max)
                .await
                .map_err(internal)?;
            if applied.is_some()
                && let ProcessChange::Output { stream, data } = &change
            {
                crate::metrics::output(stream, data.len());
            }
            if started {
                // Messages sent while it was pending.
                self.deliver(session_id).await;
            }
            if exited {
                if applied.is_some()
                    && let ProcessChange::Exited(exit) = change
                {
                    self.callback(session_id, &exit).await;
                }
                return Ok(true);
            }
        }
    }

    /// Writes the session's undelivered messages to its agent's stdin; true
    /// if every message stored so far has reached it. The delivery is
    /// recorded after the answer, still under the session's delivery lock,
    /// so the next delivery starts after it: a record lost to a crash means
    /// the messages are written again, as when the crash comes between the
    /// write and the record.
    pub async fn deliver(self: &Arc<Self>, session_id: &str) -> bool {
        let lock = self
            .delivering
            .lock()
            .expect("poisoned")
            .entry(session_id.to_owned())
            .or_default()
            .clone();
        let serial = lock.lock_owned().await;
        let recipient = match self.store.get_session(session_id).await {
            Ok(Some(row)) if row.status == troupe_proto::session::SessionStatus::Running => row,
            _ => return false,
        };
        let pending = match self.inbox_for(&recipient).await {
            Ok(pending) => pending,
            Err(e) => {
                tracing::warn!(session = session_id, error = %e, "cannot read the inbox");
                return false;
            }
        };
        let Some(last) = pending.last().map(|m| m.seq) else {
            return true;
        };
        let written = self
            .runner
            .clone()
            .write_stdin(WriteStdinRequest {
                exec_id: session_id.to_owned(),
                data: lines(&pending),
                close: false,
            })
            .await;
        if let Err(status) = written {
            tracing::debug!(session = session_id, %status, "message not delivered yet");
            return false;
        }
        let driver = self.clone();
        let session_id = session_id.to_owned();
        tokio::spawn(async move {
            match driver.store.mark_delivered(&session_id, last).await {
                Ok(()) => crate::metrics::delivered(pending.len()),
                Err(e) => {
                    tracing::warn!(session = session_id, error = %e, "cannot record a delivery")
                }
            }
            drop(serial);
        });
        true
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

    /// CALLBACK mode: tells the parent that the session has ended.
    async fn callback(self: &Arc<Self>, session_id: &str, exit: &ProcessExit) {
        let Ok(Some(process)) = self.store.process(session_id).await else {
            return;
        };
        let Ok(Some(row)) = self.store.get_session(session_id).await else {
            return;
        };
        let Some(parent) = row.parent_session_id.clone() else {
            return;
        };
        if !process.notify_parent {
            return;
        }
        let tail = String::from_utf8_lossy(&process.output_tail);
        let tail: String = tail
            .chars()
            .rev()
            .take(2000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let body = serde_json::json!({
            "type": "session_ended",
            "session_id": session_id,
            "status": troupe_proto::status::status_str(row.status),
            "exit_code": exit.code,
            "reason": exit.reason,
            "output_tail": tail,
        })
        .to_string();
        let message = NewMessage {
            message_id: format!("msg_{}", uuid::Uuid::now_v7().simple()),
            sender: "troupe".to_owned(),
            body,
        };
        let audit = system_audit("callback", &parent, true, &format!("{session_id} ended"));
        // One notice per child, however many ends are reported for it (an
        // exit after a termination, a start given up): the first stands.
        let once = Idempotency {
            caller: "troupe".to_owned(),
            action: "callback",
            request_id: session_id.to_owned(),
            payload_hash: session_id.to_owned(),
        };
        let sent = self
            .store
            .send_message(&parent, message, Some(once), audit, &|target| {
                if target.is_active() {
                    Ok(())
                } else {
                    Err(SessionError::not_found(&target.session_id))
                }
            })
            .await;
        match sent {
            Ok(sent) if !sent.replayed => {
                self.deliver(&parent).await;
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(parent = %parent, error = %e, "no callback: parent gone"),
        }
    }

    /// Fails a session whose agent is lost or could not start, and tells
    /// its parent (CALLBACK mode) as an exit would.
    async fn fail(
        self: &Arc<Self>,
        session_id: &str,
        failure: Failure,
        detail: &str,
        audit: AuditRecord,
    ) {
        match self
            .store
            .fail_session(session_id, failure, detail, audit)
            .await
        {
            Ok(true) => {
                let exit = ProcessExit {
                    code: -1,
                    reason: failure.as_str().to_owned(),
                    detail: detail.to_owned(),
                };
                self.callback(session_id, &exit).await;
            }
            Ok(false) => {}
            Err(e) => {
                tracing::error!(session = session_id, error = %e, "cannot record a lost agent")
            }
        }
    }

    /// A session that ended before its agent started: its parent (CALLBACK
    /// mode) is told, as it would be of an exit.
    async fn ended_unstarted(self: &Arc<Self>, session_id: &str) {
        let exit = ProcessExit {
            code: -1,
            reason: "not_started".to_owned(),
            detail: "the session ended before its agent started".to_owned(),
        };
        self.callback(session_id, &exit).await;
    }

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

    async fn reconcile_once(self: &Arc<Self>) -> anyhow::Result<()> {
        let execs = self
            .runner
            .clone()
            .list_execs(ListExecsRequest::default())
            .await?
            .into_inner()
            .execs;
        let known: HashMap<&str, &rpb::ExecInfo> =
            execs.iter().map(|e| (e.exec_id.as_str(), e)).collect();
        let active = self.store.active_sessions().await?;
        let active_ids: HashSet<&str> = active.iter().map(|s| s.session_id.as_str()).collect();
        for session in &active {
            if session.created_at_ms >= self.started_at_ms {
                continue;
            }
            let process = self.store.process(&session.session_id).await?;
            match (known.get(session.session_id.as_str()), process) {
                (Some(_), _) => self.follow(session.session_id.clone()),
                (None, None) => self.launch(session.clone(), false),
                // Its start was still being retried (the runner was down):
                // no event of it ever came, so start it now.
                (None, Some(process))
                    if process.runner_seq == 0
                        && session.status == troupe_proto::session::SessionStatus::Pending =>
                {
                    self.launch(session.clone(), process.notify_parent)
                }
                (None, Some(_)) => {
                    let detail = "its process is gone (the runner does not know it)";
                    let audit = system_audit("reconcile", &session.session_id, true, &detail);
                    self.fail(&session.session_id, Failure::Lost, detail, audit)
                        .await;
                }
            }
        }
        let orphans: Vec<String> = execs
            .iter()
            .filter(|e| {
                e.state() == rpb::ExecState::Running && !active_ids.contains(e.exec_id.as_str())
            })
            .map(|e| e.exec_id.clone())
            .collect();
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

/// The stdin lines of `messages`.
fn lines(messages: &[InboxMessage]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in messages {
        let line = serde_json::json!({
            "type": "message",
            "sequence": m.seq,
            "message_id": m.message_id,
            "sender": m.sender,
            "message": m.body,
        });
        out.extend_from_slice(line.to_string().as_bytes());
        out.push(b'\n');
    }
    out
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

/// What a runner event means to the ledger.
fn change(event: &rpb::ExecEvent) -> Option<ProcessChange> {
    Some(match event.event.as_ref()? {
        exec_event::Event::Started(_) => ProcessChange::Started,
        exec_event::Event::Output(out) => ProcessChange::Output {
            stream: if out.stream() == rpb::OutputStream::Stderr {
                "stderr"
            } else {
                "stdout"
            },
            data: out.data.clone(),
        },
        // The runner dropped output, to keep its log within bounds, before
        // it was read: the gap is marked where it is.
        exec_event::Event::Truncated(t) => ProcessChange::Truncated {
            log_bytes: t.dropped_bytes,
        },
        exec_event::Event::Exited(exit) => ProcessChange::Exited(ProcessExit {
            code: exit.exit_code,
            reason: match exit.reason() {
                rpb::ExitReason::Killed => "killed",
                rpb::ExitReason::TimedOut => "timed_out",
                rpb::ExitReason::ContainerLost => "container_lost",
                rpb::ExitReason::NoResources => "no_resources",
                _ => "exited",
            }
            .to_owned(),
            detail: exit.detail.clone(),
        }),
    })
}

fn internal(e: SessionError) -> Status {
    Status::internal(e.to_string())
}

fn system_audit(
    action: &'static str,
    target: &str,
    allowed: bool,
    detail: &dyn std::fmt::Display,
) -> AuditRecord {
    AuditRecord {
        caller: "troupe".to_owned(),
        action,
        target: target.to_owned(),
        allowed,
        reason: String::new(),
        detail: detail.to_string(),
    }
}
