//! A scripted agent: no model, a plan. Troupe starts it like any agent; its
//! first stdin message is the plan (a JSON object, or any other text, which
//! it only says), and it acts on it through `troupe-mcp`, started as a child
//! process and driven as a real MCP client. Each step is reported as one
//! JSON line on stdout, `{"event": ..}`, so a test or a person watching the
//! session's output can follow the team.
//!
//! The steps, each optional, in this order: `say`, `spawn` (create_session
//! for each entry), `list` (list_workspace_sessions), `send` (send_message
//! to `parent`, `children` or a session id), `wait_messages` (N messages
//! from sessions or the operator), `calls` (any tools, by name, with their
//! arguments as given), `collect` (the `session_ended` notice of
//! every callback-mode child, within `collect_timeout_s`), `reply` (a
//! message to the parent), `exit` (the exit code).
//!
//! - [`plan`]: the plan and its defaults.
//! - [`inbox`]: stdin's message lines and Troupe's notices.
//! - [`tools`]: the MCP client of `troupe-mcp`.
//! - [`out`]: the events on stdout.

mod inbox;
mod out;
mod plan;
mod tools;

use std::process::ExitCode;

use serde_json::{Value, json};

use self::{
    inbox::{Inbox, TROUPE},
    out::emit,
    plan::{Mode, Plan, Target},
    tools::{Answer, Tools},
};

/// The caller's parent session, absent for a root session.
const PARENT_ENV: &str = troupe_proto::agent::env::PARENT_SESSION_ID;
/// `child_ended` keeps at most this many characters of the child's output.
const OUTPUT_TAIL_CHARS: usize = 200;

/// Why the agent stopped before the end of its plan.
struct Stop {
    text: String,
    code: u8,
}

impl Stop {
    fn new(text: impl Into<String>) -> Stop {
        Stop {
            text: text.into(),
            code: 1,
        }
    }
}

impl From<String> for Stop {
    fn from(text: String) -> Stop {
        Stop::new(text)
    }
}

/// A child this agent created.
struct Child {
    session_id: String,
    mode: Mode,
}

struct Agent {
    inbox: Inbox,
    tools: Option<Tools>,
    parent: Option<String>,
    children: Vec<Child>,
}

/// Reads the plan, runs it, and returns the exit code: the plan's, 2 when
/// there is no usable plan, 1 when a step could not go on.
pub async fn run() -> ExitCode {
    let mut agent = Agent {
        inbox: Inbox::stdin(),
        tools: None,
        parent: std::env::var(PARENT_ENV)
            .ok()
            .map(|p| p.trim().to_owned())
            .filter(|p| !p.is_empty()),
        children: Vec::new(),
    };
    let outcome = agent.run().await;
    if let Some(tools) = agent.tools.take() {
        tools.close().await;
    }
    match outcome {
        Ok(code) => {
            emit("done", json!({ "exit_code": code }));
            ExitCode::from(code)
        }
        Err(stop) => {
            emit("error", json!({ "text": stop.text }));
            ExitCode::from(stop.code)
        }
    }
}

impl Agent {
    async fn run(&mut self) -> Result<u8, Stop> {
        let Some(first) = self.inbox.next_line().await else {
            return Err(Stop {
                text: "stdin closed before the plan (the first message) arrived".to_owned(),
                code: 2,
            });
        };
        let plan = Plan::parse(&first.message).map_err(|text| Stop { text, code: 2 })?;
        if let Some(text) = &plan.say {
            emit("say", json!({ "text": text }));
        }
        self.spawn(&plan).await?;
        if plan.list {
            self.list().await?;
        }
        for send in &plan.send {
            match send.target() {
                Target::Parent => match self.parent.clone() {
                    Some(parent) => self.send(&parent, &send.message).await?,
                    None => no_parent("send to parent"),
                },
                Target::Children => {
                    if self.children.is_empty() {
                        emit(
                            "error",
                            json!({ "text": "send to children skipped: no child was created" }),
                        );
                    }
                    let ids: Vec<String> =
                        self.children.iter().map(|c| c.session_id.clone()).collect();
                    for id in ids {
                        self.send(&id, &send.message).await?;
                    }
                }
                Target::Session(id) => self.send(id, &send.message).await?,
            }
        }
        self.wait_messages(plan.wait_messages).await?;
        for call in &plan.calls {
            match self.call(&call.tool, call.arguments.clone()).await? {
                Answer::Done(value) => {
                    emit("called", json!({ "tool": call.tool, "result": value }));
                }
                Answer::Refused { reason, text } => emit(
                    "refused",
                    json!({ "tool": call.tool, "reason": reason, "text": text }),
                ),
            }
        }
        if plan.collect {
            self.collect(&plan).await?;
        }
        if let Some(text) = &plan.reply {
            match self.parent.clone() {
                Some(parent) => self.send(&parent, text).await?,
                None => no_parent("reply"),
            }
        }
        Ok(plan.exit_code())
    }

    /// Calls a tool, starting the bridge on the first call: a plan that
    /// only talks needs no session service.
    async fn call(&mut self, name: &str, arguments: Value) -> Result<Answer, Stop> {
        if self.tools.is_none() {
            self.tools = Some(Tools::start().await?);
        }
        let tools = self.tools.as_ref().expect("started above");
        Ok(tools.call(name, arguments).await?)
    }

    async fn spawn(&mut self, plan: &Plan) -> Result<(), Stop> {
        for spawn in &plan.spawn {
            let mut arguments = json!({
                "title": spawn.title(),
                "agent_name": spawn.agent,
                "initial_message": spawn.initial_message(),
                "mode": spawn.mode.as_str(),
            });
            if let Some(trust_level) = &spawn.trust_level {
                arguments["trust_level"] = json!(trust_level);
            }
            if let Some(policy) = &spawn.on_parent_end {
                arguments["on_parent_end"] = json!(policy);
            }
            match self.call("create_session", arguments).await? {
                Answer::Done(value) => {
                    let session = &value["session"];
                    let session_id = session["session_id"].as_str().unwrap_or_default();
                    let mut event = json!({
                        "session_id": session_id,
                        "agent": spawn.agent,
                        "title": spawn.title(),
                        "mode": spawn.mode.as_str(),
                        "depth": session["depth"],
                        "trust_level": session["trust_level"],
                    });
                    if spawn.mode == Mode::Sync {
                        event["result"] = value["result"].clone();
                    }
                    emit("spawned", event);
                    self.children.push(Child {
                        session_id: session_id.to_owned(),
                        mode: spawn.mode,
                    });
                }
                Answer::Refused { reason, text } => emit(
                    "refused",
                    json!({
                        "tool": "create_session",
                        "agent": spawn.agent,
                        "reason": reason,
                        "text": text,
                    }),
                ),
            }
        }
        Ok(())
    }

    async fn list(&mut self) -> Result<(), Stop> {
        match self.call("list_workspace_sessions", json!({})).await? {
            Answer::Done(value) => {
                let ids: Vec<&str> = value["sessions"]
                    .as_array()
                    .map(|sessions| {
                        sessions
                            .iter()
                            .filter_map(|s| s["session_id"].as_str())
                            .collect()
                    })
                    .unwrap_or_default();
                emit("listed", json!({ "count": ids.len(), "session_ids": ids }));
            }
            Answer::Refused { reason, text } => emit(
                "refused",
                json!({ "tool": "list_workspace_sessions", "reason": reason, "text": text }),
            ),
        }
        Ok(())
    }

    async fn send(&mut self, to: &str, message: &str) -> Result<(), Stop> {
        let arguments = json!({ "session_id": to, "message": message });
        match self.call("send_message", arguments).await? {
            Answer::Done(value) => emit(
                "sent",
                json!({ "to": to, "delivery": value["delivery"], "message_id": value["message_id"] }),
            ),
            Answer::Refused { reason, text } => emit(
                "refused",
                json!({ "tool": "send_message", "to": to, "reason": reason, "text": text }),
            ),
        }
        Ok(())
    }

    /// Prints the next `count` messages that are not Troupe's; Troupe's
    /// notices read meanwhile are kept for `collect`.
    async fn wait_messages(&mut self, count: u32) -> Result<(), Stop> {
        let mut seen = 0;
        while seen < count {
            let line = self.inbox.next_line().await.ok_or_else(|| {
                Stop::new(format!(
                    "stdin closed after {seen} of the {count} messages the plan waits for"
                ))
            })?;
            if line.sender == TROUPE {
                self.inbox.hold(line);
                continue;
            }
            emit(
                "message",
                json!({ "from": line.sender, "message": line.message }),
            );
            seen += 1;
        }
        Ok(())
    }

    /// Waits for the end of every callback-mode child, printing the
    /// messages that arrive meanwhile, until the plan's timeout.
    async fn collect(&mut self, plan: &Plan) -> Result<(), Stop> {
        let mut pending: Vec<String> = self
            .children
            .iter()
            .filter(|c| c.mode == Mode::Callback)
            .map(|c| c.session_id.clone())
            .collect();
        let timeout = plan.collect_timeout();
        let deadline = tokio::time::Instant::now() + timeout;
        while !pending.is_empty() {
            let line = match tokio::time::timeout_at(deadline, self.inbox.next_any()).await {
                Err(_) => {
                    emit(
                        "timeout",
                        json!({
                            "step": "collect",
                            "after_s": timeout.as_secs_f64(),
                            "pending": pending,
                        }),
                    );
                    return Ok(());
                }
                Ok(None) => {
                    return Err(Stop::new(format!(
                        "stdin closed while {} child session(s) had not ended: {}",
                        pending.len(),
                        pending.join(", ")
                    )));
                }
                Ok(Some(line)) => line,
            };
            if line.sender != TROUPE {
                emit(
                    "message",
                    json!({ "from": line.sender, "message": line.message }),
                );
                continue;
            }
            let Some(ended) = line.ended() else { continue };
            let Some(index) = pending.iter().position(|id| *id == ended.session_id) else {
                continue;
            };
            pending.remove(index);
            emit(
                "child_ended",
                json!({
                    "session_id": ended.session_id,
                    "status": ended.status,
                    "exit_code": ended.exit_code,
                    "reason": ended.reason,
                    "output_tail": out::tail(&ended.output_tail, OUTPUT_TAIL_CHARS),
                }),
            );
        }
        Ok(())
    }
}

fn no_parent(step: &str) {
    emit(
        "error",
        json!({ "text": format!("{step} skipped: this session has no parent ({PARENT_ENV} is not set)") }),
    );
}
