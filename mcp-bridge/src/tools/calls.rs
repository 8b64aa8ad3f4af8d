//! What the tools do: each call reads the caller's session, sends its
//! request to the session service, and shapes the answer with
//! [`crate::view`]; `wait_for_session` follows the session's events, and
//! reads it again when the stream is lost.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use rmcp::{
    ErrorData,
    model::{CallToolResult, ContentBlock, Extensions},
};
use serde_json::{Value, json};
use tracing::Instrument;
use troupe_proto::{
    failover,
    scope::WriteScope,
    session::{self as pb, ExecutionMode, ParentEndPolicy, TrustLevel},
    status::is_ended,
    trust,
};
use troupe_telemetry as telemetry;

use super::{
    Bridge,
    args::{CreateSessionArgs, ListArgs, ProgressArgs, SendMessageArgs, WaitArgs, wait_timeout},
};
use crate::{
    backend::{Backend, Session},
    caller::Identity,
    failure::ToolFailure,
    view,
};

const POLL_EVERY: Duration = Duration::from_secs(1);
/// `list_workspace_sessions` reads at most this many pages.
const MAX_PAGES: usize = 100;

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
    pub(super) async fn traced(
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
    pub(super) async fn session(&self, extensions: &Extensions) -> Result<Session, ToolFailure> {
        let auth = self.identity.authorization(extensions)?;
        let traceparent = telemetry::traceparent_of(&tracing::Span::current())
            .and_then(|text| text.parse().ok())
            .or_else(|| self.identity.traceparent(extensions));
        self.backend.session(auth, traceparent).await
    }

    pub(super) fn refused(&self, status: &tonic::Status) -> ToolFailure {
        ToolFailure::from_status(status, self.backend.endpoint())
    }

    pub(super) async fn create(
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
        let budget = args.budget()?;
        let writable_paths = args.writable_paths.unwrap_or_default();
        WriteScope::parse(&writable_paths)
            .map_err(|why| ToolFailure::invalid("writable_paths", why))?;
        let session = self.session(extensions).await?;
        // Its own request id: repeated on another endpoint, it is replayed there.
        let request = pb::CreateSessionRequest {
            title: args.title,
            agent_name: args.agent_name,
            initial_message: args.initial_message,
            trust_level: trust_level as i32,
            mode: mode as i32,
            request_id: failover::fresh_request_id(),
            budget,
            writable_paths,
            on_parent_end: args
                .on_parent_end
                .map_or(ParentEndPolicy::Unspecified, Into::into) as i32,
            ..Default::default()
        };
        let response = session
            .call(
                &request,
                |mut c, r| async move { c.create_session(r).await },
            )
            .await
            .map_err(|s| self.refused(&s))?;
        Ok(view::created(&response))
    }

    pub(super) async fn send(
        &self,
        extensions: &Extensions,
        args: SendMessageArgs,
    ) -> Result<Value, ToolFailure> {
        let session = self.session(extensions).await?;
        let request = pb::SendMessageRequest {
            session_id: args.session_id,
            message: args.message,
            request_id: failover::fresh_request_id(),
        };
        let response = session
            .call(&request, |mut c, r| async move { c.send_message(r).await })
            .await
            .map_err(|s| self.refused(&s))?;
        Ok(view::sent(&response))
    }

    pub(super) async fn list(
        &self,
        extensions: &Extensions,
        args: ListArgs,
    ) -> Result<Value, ToolFailure> {
        let session = self.session(extensions).await?;
        let mut sessions = Vec::new();
        let mut page_token = String::new();
        for _ in 0..MAX_PAGES {
            let request = pb::ListWorkspaceSessionsRequest {
                workspace_id: String::new(),
                include_ended: args.include_ended.unwrap_or(false),
                page_size: 0,
                page_token: std::mem::take(&mut page_token),
            };
            let page = session
                .call(&request, |mut c, r| async move {
                    c.list_workspace_sessions(r).await
                })
                .await
                .map_err(|s| self.refused(&s))?;
            sessions.extend(page.sessions);
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
        Ok(view::listed(&sessions))
    }

    pub(super) async fn get(
        &self,
        extensions: &Extensions,
        session_id: &str,
    ) -> Result<Value, ToolFailure> {
        let session = self.session(extensions).await?;
        let response = self.read(&session, session_id).await?;
        Ok(view::got(&response))
    }

    async fn read(
        &self,
        session: &Session,
        session_id: &str,
    ) -> Result<pb::GetSessionResponse, ToolFailure> {
        let request = pb::GetSessionRequest {
            session_id: session_id.to_owned(),
        };
        session
            .call(&request, |mut c, r| async move { c.get_session(r).await })
            .await
            .map_err(|s| self.refused(&s))
    }

    pub(super) async fn terminate(
        &self,
        extensions: &Extensions,
        session_id: &str,
    ) -> Result<Value, ToolFailure> {
        let session = self.session(extensions).await?;
        // Repeating a termination is harmless: what had ended stays ended.
        let request = pb::TerminateSessionRequest {
            session_id: session_id.to_owned(),
            reason: String::new(),
        };
        let response = session
            .call(
                &request,
                |mut c, r| async move { c.terminate_session(r).await },
            )
            .await
            .map_err(|s| self.refused(&s))?;
        Ok(view::terminated(&response))
    }

    pub(super) async fn progress(
        &self,
        extensions: &Extensions,
        args: ProgressArgs,
    ) -> Result<Value, ToolFailure> {
        let session = self.session(extensions).await?;
        // A repeated report only records the same progress again.
        let request = pb::ReportProgressRequest {
            progress: args.progress,
            description: args.description.unwrap_or_default(),
        };
        let response = session
            .call(
                &request,
                |mut c, r| async move { c.report_progress(r).await },
            )
            .await
            .map_err(|s| self.refused(&s))?;
        Ok(json!({ "sequence": response.sequence }))
    }

    /// Waits for the session's end. The live watch is opened before the first
    /// read, so an end between the two is seen by one or the other; if the
    /// watch breaks (a service restart), the wait goes on by polling. The
    /// session is read again at the end, so the answer is its latest view.
    pub(super) async fn wait(
        &self,
        extensions: &Extensions,
        args: WaitArgs,
    ) -> Result<Value, ToolFailure> {
        let timeout = wait_timeout(args.timeout_s)?;
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        let id = args.session_id;
        let session = self.session(extensions).await?;
        let request = pb::WatchSessionsRequest {
            session_id: id.clone(),
            live_only: true,
            ..Default::default()
        };
        let watch = || {
            session.call(
                &request,
                |mut c, r| async move { c.watch_sessions(r).await },
            )
        };
        let mut events = Some(watch().await.map_err(|s| self.refused(&s))?);
        let mut last = self.read(&session, &id).await?;
        while !has_ended(&last) {
            let woke = match events.as_mut() {
                Some(stream) => match tokio::time::timeout_at(deadline, stream.message()).await {
                    Err(_) => break,
                    Ok(Ok(Some(event))) => event.session_id == id && is_ended(event.status()),
                    // Its server stops: watch again, on another endpoint first
                    // (or poll, while none answers), then read the session again.
                    Ok(Ok(None) | Err(_)) => {
                        session.move_on();
                        events = watch().await.ok();
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
                match self.read(&session, &id).await {
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
            if let Ok(now) = self.read(&session, &id).await {
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
