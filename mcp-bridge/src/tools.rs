//! The tools. Names and arguments follow the seeds (`create_session`,
//! `send_message`, `list_workspace_sessions`) plus `get_session`,
//! `wait_for_session`, `terminate_session` and `report_progress`. Each validates only what it
//! must to build the request; the session service decides everything else.
//! Results are pretty JSON text with the same value as structured content;
//! failures are tool errors ([`crate::failure`]).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use rmcp::{
    ErrorData, ServerHandler,
    handler::server::{router::tool::ToolRouter, wrapper::Parameters},
    model::{
        CallToolResult, ContentBlock, Extensions, Implementation, ServerCapabilities, ServerConfig,
    },
    tool, tool_handler, tool_router,
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::Instrument;
use troupe_proto::{
    session::{self as pb, ExecutionMode, TrustLevel},
    status::is_ended,
    trust,
};
use troupe_telemetry as telemetry;

use crate::{
    backend::{Backend, Session},
    caller::Identity,
    failure::ToolFailure,
    view,
};

/// `wait_for_session` waits this long when no timeout is given.
pub const DEFAULT_WAIT_SECS: f64 = 300.0;
/// ... and never longer than this.
pub const MAX_WAIT_SECS: f64 = 3600.0;
/// How often `wait_for_session` reads the session when the event stream is lost.
const POLL_EVERY: Duration = Duration::from_secs(1);
/// `list_workspace_sessions` reads at most this many pages.
const MAX_PAGES: usize = 100;

const INSTRUCTIONS: &str = "Troupe sessions: this server acts as the calling agent's own session. \
Use create_session to start a child agent in this workspace, send_message to talk to another \
session, list_workspace_sessions to discover the team, get_session and wait_for_session to \
follow a session, terminate_session to end one below you, report_progress to tell watchers \
how far your own task has come. The session service enforces every \
rule (workspace, trust level, spawn limits); a refused call is a tool error saying which rule \
refused it and what quota is left.";

/// Arguments of `create_session`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateSessionArgs {
    /// A short human-readable title for the new session, e.g. "API implementation".
    pub title: String,
    /// The agent to run: the name of an agent definition (Agents/<name>.md) of this
    /// workspace, e.g. "python-specialist".
    pub agent_name: String,
    /// The first message the new agent receives: its task, stated completely.
    pub initial_message: String,
    /// Optional: "sandboxed" (or "untrusted") to give the child less trust than this
    /// session. Omit it to inherit this session's level. "direct" (or "trusted") is
    /// allowed only for a direct caller; trust can never be raised.
    #[serde(default)]
    pub trust_level: Option<String>,
    /// Optional: how the call returns. "async" (default): at once, follow up with
    /// get_session or wait_for_session. "sync": when the child has ended, with its
    /// result (status, exit_code, output_tail). "callback": at once, and when the child
    /// ends this session receives a message saying so.
    #[serde(default)]
    pub mode: Option<Mode>,
}

/// How `create_session` returns.
#[derive(Clone, Copy, Debug, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub enum Mode {
    Async,
    Sync,
    Callback,
}

impl From<Mode> for ExecutionMode {
    fn from(mode: Mode) -> Self {
        match mode {
            Mode::Async => ExecutionMode::Async,
            Mode::Sync => ExecutionMode::Sync,
            Mode::Callback => ExecutionMode::Callback,
        }
    }
}

/// Arguments of `send_message`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SendMessageArgs {
    /// The recipient's session id (`sess_...`), as create_session or
    /// list_workspace_sessions returned it.
    pub session_id: String,
    /// The message text.
    pub message: String,
}

/// Arguments of `list_workspace_sessions`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub struct ListArgs {
    /// Optional: also list sessions that have ended (completed, failed, terminated).
    /// Default false: active sessions only.
    #[serde(default)]
    pub include_ended: Option<bool>,
}

/// Arguments of the tools that name one session.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SessionArgs {
    /// The session id (`sess_...`).
    pub session_id: String,
}

/// Arguments of `report_progress`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ProgressArgs {
    /// Percent of the task done, 0 to 100.
    pub progress: u32,
    /// Optional: what is being done now, in a few words (at most 256 bytes).
    #[serde(default)]
    pub description: Option<String>,
}

/// Arguments of `wait_for_session`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct WaitArgs {
    /// The session id (`sess_...`).
    pub session_id: String,
    /// Optional: the longest wait in seconds (default 300, at most 3600).
    #[serde(default)]
    pub timeout_s: Option<f64>,
}

/// The MCP server: the tools, acting with the caller's token.
#[derive(Clone)]
pub struct Bridge {
    backend: Arc<Backend>,
    identity: Identity,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Bridge {
    #[tool(
        name = "create_session",
        description = "Create a child session: start another agent in this workspace, as a \
child of the calling session. The child inherits the workspace, and this session's trust level \
unless trust_level narrows it (a sandboxed session creates only sandboxed children). The session \
service enforces the spawn limits (tree depth, sessions per tree, children per session, active \
sessions per workspace, spawn rate); a refusal says which limit and what is left. Returns the new \
session (session_id, status, depth, trust_level, ...), the quota left after it, and for mode \
\"sync\" the child's result (status, exit_code, output_tail).",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            open_world_hint = false
        )
    )]
    async fn create_session(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<CreateSessionArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced(
            "create_session",
            &extensions,
            self.create(&extensions, args),
        )
        .await
    }

    #[tool(
        name = "send_message",
        description = "Send a message to another session of this workspace (a child, the \
parent, a sibling). It is stored in the recipient's inbox and written to its agent's input when \
that agent runs. A sandboxed session can message only sandboxed sessions. Returns delivery: \
\"delivered\" (written to the running agent now) or \"queued\" (stored; the agent gets it when \
it runs).",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            open_world_hint = false
        )
    )]
    async fn send_message(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<SendMessageArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced("send_message", &extensions, self.send(&extensions, args))
            .await
    }

    #[tool(
        name = "list_workspace_sessions",
        description = "List the sessions of this workspace that the calling session may see \
(a sandboxed session sees only sandboxed sessions): id, title, agent, status, trust level, depth \
and parent of each. Active sessions only, unless include_ended is true.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_workspace_sessions(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<ListArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced(
            "list_workspace_sessions",
            &extensions,
            self.list(&extensions, args),
        )
        .await
    }

    #[tool(
        name = "get_session",
        description = "Get one session this session may see: its status, exit code and the \
tail of its output (in result), and its direct children.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn get_session(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<SessionArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced(
            "get_session",
            &extensions,
            self.get(&extensions, &args.session_id),
        )
        .await
    }

    #[tool(
        name = "wait_for_session",
        description = "Wait until a session has ended (completed, failed or terminated) or \
timeout_s seconds have passed (default 300, at most 3600). Returns what get_session returns, \
plus timed_out (true when the session was still active at the deadline) and waited_s.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn wait_for_session(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<WaitArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced(
            "wait_for_session",
            &extensions,
            self.wait(&extensions, args),
        )
        .await
    }

    #[tool(
        name = "terminate_session",
        description = "Terminate a session below the calling one in its spawn tree (a child or \
any descendant), and with it every active session under it. Returns the ids of the sessions it \
ended. Terminating a session that has already ended is harmless.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn terminate_session(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<SessionArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced(
            "terminate_session",
            &extensions,
            self.terminate(&extensions, &args.session_id),
        )
        .await
    }

    #[tool(
        name = "report_progress",
        description = "Report how far this session's own task has come: progress in percent \
(0 to 100) and, optionally, a few words on what is being done. Whoever watches the spawn tree \
(the parent, an operator) sees it as a progress event of this session. Returns the event's \
sequence.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn report_progress(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<ProgressArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced(
            "report_progress",
            &extensions,
            self.progress(&extensions, args),
        )
        .await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Bridge {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("troupe-mcp", env!("CARGO_PKG_VERSION"))
                    .with_title("Troupe sessions"),
            )
            .with_instructions(INSTRUCTIONS)
    }
}

impl Bridge {
    /// A bridge reaching the session service through `backend`, acting as `identity`.
    pub fn new(backend: Arc<Backend>, identity: Identity) -> Self {
        Bridge {
            backend,
            identity,
            tool_router: Self::tool_router(),
        }
    }

    /// Runs a tool's call in its span (the GenAI `execute_tool` operation),
    /// which continues the agent's trace when the call carries it; the
    /// session service's spans of the call go under it.
    async fn traced(
        &self,
        tool: &'static str,
        extensions: &Extensions,
        call: impl Future<Output = Result<Value, ToolFailure>>,
    ) -> Result<CallToolResult, ErrorData> {
        let span = tracing::info_span!(
            "execute_tool",
            otel.name = %format_args!("execute_tool {tool}"),
            otel.status_code = tracing::field::Empty,
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = tool,
        );
        if let Some(traceparent) = self.identity.traceparent(extensions)
            && let Ok(text) = traceparent.to_str()
        {
            telemetry::continue_remote(&span, text);
        }
        let result = call.instrument(span.clone()).await;
        if result.is_err() {
            span.record("otel.status_code", "ERROR");
        }
        Ok(outcome(result))
    }

    /// A client acting as the caller. Inside a traced tool span, the
    /// service's spans go under that span; otherwise the agent's own trace
    /// context, if any, is forwarded as it came.
    async fn session(&self, extensions: &Extensions) -> Result<Session, ToolFailure> {
        let auth = self.identity.authorization(extensions)?;
        let traceparent = telemetry::traceparent_of(&tracing::Span::current())
            .and_then(|text| text.parse().ok())
            .or_else(|| self.identity.traceparent(extensions));
        self.backend.session(auth, traceparent).await
    }

    fn refused(&self, status: &tonic::Status) -> ToolFailure {
        ToolFailure::from_status(status, self.backend.endpoint())
    }

    async fn create(
        &self,
        extensions: &Extensions,
        args: CreateSessionArgs,
    ) -> Result<Value, ToolFailure> {
        let trust_level = match args.trust_level.as_deref().map(str::trim) {
            None | Some("") => TrustLevel::Unspecified,
            Some(text) => trust::parse(text).ok_or_else(|| {
                ToolFailure::invalid(
                    "trust_level",
                    format!(
                        "trust_level {text:?} is not a trust level: use \"sandboxed\" (or \
                         \"untrusted\"), \"direct\" (or \"trusted\"), or leave it out to inherit"
                    ),
                )
            })?,
        };
        let mode = args.mode.map_or(ExecutionMode::Unspecified, Into::into);
        let mut session = self.session(extensions).await?;
        let request = session.request(pb::CreateSessionRequest {
            title: args.title,
            agent_name: args.agent_name,
            initial_message: args.initial_message,
            trust_level: trust_level as i32,
            mode: mode as i32,
            ..Default::default()
        });
        let response = session
            .client()
            .create_session(request)
            .await
            .map_err(|s| self.refused(&s))?
            .into_inner();
        Ok(view::created(&response))
    }

    async fn send(
        &self,
        extensions: &Extensions,
        args: SendMessageArgs,
    ) -> Result<Value, ToolFailure> {
        let mut session = self.session(extensions).await?;
        let request = session.request(pb::SendMessageRequest {
            session_id: args.session_id,
            message: args.message,
            request_id: String::new(),
        });
        let response = session
            .client()
            .send_message(request)
            .await
            .map_err(|s| self.refused(&s))?
            .into_inner();
        Ok(view::sent(&response))
    }

    async fn list(&self, extensions: &Extensions, args: ListArgs) -> Result<Value, ToolFailure> {
        let mut session = self.session(extensions).await?;
        let mut sessions = Vec::new();
        let mut page_token = String::new();
        for _ in 0..MAX_PAGES {
            let request = session.request(pb::ListWorkspaceSessionsRequest {
                workspace_id: String::new(),
                include_ended: args.include_ended.unwrap_or(false),
                page_size: 0,
                page_token: std::mem::take(&mut page_token),
            });
            let page = session
                .client()
                .list_workspace_sessions(request)
                .await
                .map_err(|s| self.refused(&s))?
                .into_inner();
            sessions.extend(page.sessions);
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
        Ok(view::listed(&sessions))
    }

    async fn get(&self, extensions: &Extensions, session_id: &str) -> Result<Value, ToolFailure> {
        let mut session = self.session(extensions).await?;
        let response = self.read(&mut session, session_id).await?;
        Ok(view::got(&response))
    }

    async fn read(
        &self,
        session: &mut Session,
        session_id: &str,
    ) -> Result<pb::GetSessionResponse, ToolFailure> {
        let request = session.request(pb::GetSessionRequest {
            session_id: session_id.to_owned(),
        });
        session
            .client()
            .get_session(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| self.refused(&s))
    }

    async fn terminate(
        &self,
        extensions: &Extensions,
        session_id: &str,
    ) -> Result<Value, ToolFailure> {
        let mut session = self.session(extensions).await?;
        let request = session.request(pb::TerminateSessionRequest {
            session_id: session_id.to_owned(),
            reason: String::new(),
        });
        let response = session
            .client()
            .terminate_session(request)
            .await
            .map_err(|s| self.refused(&s))?
            .into_inner();
        Ok(view::terminated(&response))
    }

    async fn progress(
        &self,
        extensions: &Extensions,
        args: ProgressArgs,
    ) -> Result<Value, ToolFailure> {
        let mut session = self.session(extensions).await?;
        let request = session.request(pb::ReportProgressRequest {
            progress: args.progress,
            description: args.description.unwrap_or_default(),
        });
        let response = session
            .client()
            .report_progress(request)
            .await
            .map_err(|s| self.refused(&s))?
            .into_inner();
        Ok(json!({ "sequence": response.sequence }))
    }

    /// Waits for the session's end. The live watch is opened before the first
    /// read, so an end between the two is seen by one or the other; if the
    /// watch breaks (a service restart), the wait goes on by polling. The
    /// session is read again at the end, so the answer is its latest view.
    async fn wait(&self, extensions: &Extensions, args: WaitArgs) -> Result<Value, ToolFailure> {
        let timeout = wait_timeout(args.timeout_s)?;
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        let id = args.session_id;
        let mut session = self.session(extensions).await?;
        let request = session.request(pb::WatchSessionsRequest {
            session_id: id.clone(),
            live_only: true,
            ..Default::default()
        });
        let mut events = Some(
            session
                .client()
                .watch_sessions(request)
                .await
                .map_err(|s| self.refused(&s))?
                .into_inner(),
        );
        let mut last = self.read(&mut session, &id).await?;
        while !has_ended(&last) {
            let woke = match events.as_mut() {
                Some(stream) => match tokio::time::timeout_at(deadline, stream.message()).await {
                    Err(_) => break,
                    Ok(Ok(Some(event))) => event.session_id == id && is_ended(event.status()),
                    Ok(Ok(None) | Err(_)) => {
                        events = None;
                        true
                    }
                },
                None => {
                    if tokio::time::Instant::now() >= deadline {
                        break;
                    }
                    tokio::time::sleep_until(
                        deadline.min(tokio::time::Instant::now() + POLL_EVERY),
                    )
                    .await;
                    true
                }
            };
            if woke {
                match self.read(&mut session, &id).await {
                    Ok(now) => last = now,
                    // While the service restarts, polling goes on until the deadline:
                    // a call on the dropped connection is cancelled, later ones are
                    // unavailable until it is back.
                    Err(failure)
                        if events.is_none()
                            && matches!(failure.code, "UNAVAILABLE" | "CANCELLED") => {}
                    Err(failure) => return Err(failure),
                }
            }
        }
        if !has_ended(&last) {
            // The view at the deadline, when the service answers.
            if let Ok(now) = self.read(&mut session, &id).await {
                last = now;
            }
        }
        let mut value = view::got(&last);
        if let Value::Object(map) = &mut value {
            map.insert("timed_out".to_owned(), json!(!has_ended(&last)));
            map.insert(
                "waited_s".to_owned(),
                json!((started.elapsed().as_secs_f64() * 10.0).round() / 10.0),
            );
        }
        Ok(value)
    }
}

fn has_ended(response: &pb::GetSessionResponse) -> bool {
    response
        .session
        .as_ref()
        .is_some_and(|s| is_ended(s.status()))
}

/// The wait's length: the default when absent, capped, never negative.
fn wait_timeout(seconds: Option<f64>) -> Result<Duration, ToolFailure> {
    let seconds = seconds.unwrap_or(DEFAULT_WAIT_SECS);
    if !seconds.is_finite() {
        return Err(ToolFailure::invalid(
            "timeout_s",
            "timeout_s must be a number of seconds",
        ));
    }
    Ok(Duration::from_secs_f64(seconds.clamp(0.0, MAX_WAIT_SECS)))
}

/// A tool's answer: pretty JSON text plus the same value as structured
/// content, or the failure as a tool error.
fn outcome(result: Result<Value, ToolFailure>) -> CallToolResult {
    match result {
        Ok(value) => {
            let text = serde_json::to_string_pretty(&value).unwrap_or_else(|_| value.to_string());
            let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
            result.structured_content = Some(value);
            result
        }
        Err(failure) => failure.into_result(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_timeout_defaults_and_caps() {
        assert_eq!(wait_timeout(None).unwrap(), Duration::from_secs(300));
        assert_eq!(wait_timeout(Some(1e9)).unwrap(), Duration::from_secs(3600));
        assert_eq!(wait_timeout(Some(-5.0)).unwrap(), Duration::ZERO);
        assert_eq!(wait_timeout(Some(0.5)).unwrap(), Duration::from_millis(500));
        assert!(wait_timeout(Some(f64::NAN)).is_err());
    }

    #[test]
    fn mode_words() {
        let args: CreateSessionArgs = serde_json::from_value(json!({
            "title": "t", "agent_name": "a", "initial_message": "m", "mode": "sync"
        }))
        .unwrap();
        assert_eq!(args.mode, Some(Mode::Sync));
        assert_eq!(ExecutionMode::from(Mode::Callback), ExecutionMode::Callback);
    }
}
