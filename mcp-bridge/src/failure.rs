//! Failures as the agent sees them: MCP tool errors (`isError: true`) whose
//! text says what refused the call, under which rule, what is left of the
//! quota and what to do instead, with the same facts as structured content.
//! Refusals of the session service keep its `ErrorInfo` reason and metadata
//! ([`troupe_proto::refusal`]); the bridge's own checks (token, session hint,
//! arguments) use the same shape.

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{Map, Value, json};
use tonic::{Code, Status};
use tonic_types::StatusExt;
use troupe_proto::refusal::{self, Reason, Refusal};

/// Who refused a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The session service: a rule of the spawn tree, or the token.
    SessionService,
    /// The bridge: the call was never forwarded.
    Bridge,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Source::SessionService => "session-service",
            Source::Bridge => "bridge",
        }
    }
}

/// Why a tool call did not happen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolFailure {
    pub source: Source,
    /// gRPC code name (`RESOURCE_EXHAUSTED`, `UNAUTHENTICATED`, ...).
    pub code: &'static str,
    /// Machine-readable reason (`DEPTH_EXCEEDED`, ...), when there is one.
    pub reason: Option<Reason>,
    pub message: String,
    /// `ErrorInfo` metadata, sorted by key (quota left, the field at fault).
    pub metadata: Vec<(String, String)>,
    /// What the agent can do about it.
    pub advice: Option<String>,
}

impl ToolFailure {
    /// A call the session service answered with an error.
    pub fn from_status(status: &Status, endpoint: &str) -> Self {
        let refusal = Refusal::from_status(status);
        if status.code() == Code::Unavailable && refusal.reason.is_none() {
            return ToolFailure::unreachable(endpoint, &refusal.message);
        }
        let retry_ms = status
            .get_details_retry_info()
            .and_then(|info| info.retry_delay)
            .map(|delay| delay.as_millis());
        let advice = refusal
            .reason
            .as_ref()
            .and_then(|reason| advice(reason, retry_ms));
        ToolFailure {
            source: Source::SessionService,
            code: refusal.code,
            reason: refusal.reason,
            message: refusal.message,
            metadata: refusal.metadata,
            advice,
        }
    }

    /// The session service could not be reached.
    pub fn unreachable(endpoint: &str, detail: &str) -> Self {
        ToolFailure {
            source: Source::Bridge,
            code: "UNAVAILABLE",
            reason: None,
            message: if detail.contains(endpoint) {
                format!("cannot reach the session service: {detail}")
            } else {
                format!("cannot reach the session service at {endpoint}: {detail}")
            },
            metadata: Vec::new(),
            advice: Some(
                "The session service may be restarting: retry in a few seconds. Nothing was done."
                    .to_owned(),
            ),
        }
    }

    /// A check of the bridge itself refused the call before anything was forwarded.
    pub fn bridge(code: &'static str, reason: Reason, message: impl Into<String>) -> Self {
        ToolFailure {
            source: Source::Bridge,
            code,
            reason: Some(reason),
            message: message.into(),
            metadata: Vec::new(),
            advice: None,
        }
    }

    /// An argument the bridge cannot forward.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        let mut failure = ToolFailure::bridge("INVALID_ARGUMENT", Reason::InvalidArgument, message);
        failure.metadata = vec![("field".to_owned(), field.to_owned())];
        failure
    }

    /// Adds advice.
    pub fn with_advice(mut self, advice: impl Into<String>) -> Self {
        self.advice = Some(advice.into());
        self
    }

    /// The text form: `refused by the session service: <message> (reason: X, k=v)`
    /// (or `refused by the bridge: ...`, or `not done: ...` when the service
    /// could not be reached), and the advice on a second line.
    pub fn text(&self) -> String {
        let by = match (self.source, self.code) {
            (Source::SessionService, _) => "refused by the session service",
            (Source::Bridge, "UNAVAILABLE") => "not done",
            (Source::Bridge, _) => "refused by the bridge",
        };
        let mut out = format!(
            "{by}: {}",
            refusal::describe(&self.message, self.reason.as_ref(), &self.metadata)
        );
        if let Some(advice) = &self.advice {
            out.push('\n');
            out.push_str(advice);
        }
        out
    }

    /// The structured form: `{"error": {source, code, reason, message, metadata, advice}}`.
    pub fn json(&self) -> Value {
        let metadata: Map<String, Value> = self
            .metadata
            .iter()
            .map(|(k, v)| {
                // Quota counts are numbers; keep them numbers.
                let value = v
                    .parse::<u64>()
                    .map_or_else(|_| Value::String(v.clone()), Value::from);
                (k.clone(), value)
            })
            .collect();
        json!({
            "error": {
                "source": self.source.as_str(),
                "code": self.code,
                "reason": self.reason.as_ref().map(Reason::as_str),
                "message": self.message,
                "metadata": metadata,
                "advice": self.advice,
            }
        })
    }

    /// The MCP tool result: `isError: true`, the text, and the structured form.
    pub fn into_result(self) -> CallToolResult {
        let mut result = CallToolResult::error(vec![ContentBlock::text(self.text())]);
        result.structured_content = Some(self.json());
        result
    }
}

/// What an agent can do after a refusal with `reason`.
fn advice(reason: &Reason, retry_ms: Option<u128>) -> Option<String> {
    let text = match reason {
        Reason::DepthExceeded => {
            "This session is as deep in the spawn tree as the service allows, so it cannot \
             create children: do the work in this session, or report back to its parent."
        }
        Reason::TreeQuotaExceeded => {
            "The spawn tree has used every session it may hold (ended ones count too): \
             reuse existing sessions with send_message instead of creating new ones."
        }
        Reason::ChildQuotaExceeded => {
            "This session has created as many children as it may (ended ones count too): \
             reuse existing children with send_message."
        }
        Reason::WorkspaceQuotaExceeded => {
            "The workspace has as many active sessions as it may: wait for some to end \
             (wait_for_session), then retry."
        }
        Reason::RateLimited => {
            return Some(match retry_ms {
                Some(ms) => format!(
                    "This session is creating sessions or sending messages too fast: retry in {ms} ms."
                ),
                None => "This session is creating sessions or sending messages faster than \
                         allowed (a broadcast counts each recipient): send to fewer at once."
                    .to_owned(),
            });
        }
        Reason::TrustEscalation => {
            "A sandboxed session may create only sandboxed sessions: omit trust_level \
             (children inherit the caller's level) or pass \"sandboxed\"."
        }
        Reason::ScopeEscalation => {
            "A child may write only inside its parent's write scope: omit writable_paths \
             (children inherit the caller's scope) or name directories inside it."
        }
        Reason::ParentNotRunning => {
            "The session that would act has ended: an ended session creates no children \
             and takes no reply."
        }
        Reason::NoParent => {
            "This session is a root: it has no parent to reply to. Report the outcome with \
             finish, or message a session by its id with send_message."
        }
        Reason::SessionEnded => "That session has ended: it takes no more messages.",
        Reason::FanOutExceeded => {
            "One message may reach only so many sessions (the message says how many): \
             broadcast to a narrower scope (children, subtree) or post to a smaller group."
        }
        Reason::InboxFull => {
            "That session's inbox holds as many unread bytes as one may: wait until it has \
             read its messages (wait_for_session, or its reply), or send less."
        }
        Reason::GroupNotFound => {
            "No group of that name that this session is a member of: list_groups shows \
             this session's groups; create_group makes one."
        }
        Reason::GroupExists => {
            "Another session's group has that name in this workspace: choose another name."
        }
        Reason::SessionNotFound => {
            "No such session, or this session may not see it (the two answers are the same): \
             list_workspace_sessions shows the sessions this session may see."
        }
        Reason::AgentNotFound => {
            "No agent definition by that name: the operator defines agents (in the database or \
             the agents directory, never in the workspace); the message may say where a file \
             found elsewhere belongs."
        }
        Reason::AgentInvalid => {
            "The agent definition exists but is malformed; the message says why."
        }
        Reason::NotADescendant => {
            "A session may terminate only sessions below it in its spawn tree (its children \
             and their descendants)."
        }
        Reason::ParentOverrideForbidden => "A session creates children only under itself.",
        Reason::OperatorOnly => "Only the operator may do that.",
        Reason::TokenMissing | Reason::TokenInvalid => {
            "The bridge needs this session's own token: TROUPE_SESSION_TOKEN on stdio, \
             `Authorization: Bearer <token>` over HTTP."
        }
        Reason::TokenExpired => "The session token has expired; the operator can issue a new one.",
        Reason::TokenRevoked => "This session has ended, and its token with it.",
        Reason::BudgetExceeded => {
            "A budget of this spawn tree is spent, or smaller than what was asked (the \
             metadata says whose, in which dimension, and what is left): finish the work \
             with this session, or report back to its parent."
        }
        _ => return None,
    };
    Some(text.to_owned())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tonic_types::ErrorDetails;

    use super::*;

    #[test]
    fn depth_refusal_says_rule_quota_and_advice() {
        let metadata = HashMap::from([
            ("tree_sessions_remaining".to_owned(), "7".to_owned()),
            ("depth_remaining".to_owned(), "0".to_owned()),
            ("children_remaining".to_owned(), "10".to_owned()),
        ]);
        let status = Status::with_error_details(
            Code::ResourceExhausted,
            "depth limit exceeded",
            ErrorDetails::with_error_info("DEPTH_EXCEEDED", "troupe", metadata),
        );
        let failure = ToolFailure::from_status(&status, "http://127.0.0.1:7400");
        let text = failure.text();
        assert!(
            text.starts_with(
                "refused by the session service: depth limit exceeded (reason: DEPTH_EXCEEDED, \
                 children_remaining=10, depth_remaining=0, tree_sessions_remaining=7)\n"
            ),
            "{text}"
        );
        assert!(text.contains("cannot create children"), "{text}");
        let json = failure.clone().json();
        assert_eq!(json["error"]["reason"], "DEPTH_EXCEEDED");
        assert_eq!(json["error"]["metadata"]["depth_remaining"], 0);
        let result = failure.into_result();
        assert_eq!(result.is_error, Some(true));
    }

    #[test]
    fn unavailable_names_the_endpoint() {
        let failure =
            ToolFailure::from_status(&Status::unavailable("connection refused"), "unix:///x.sock");
        assert_eq!(
            failure.text().lines().next(),
            Some(
                "not done: cannot reach the session service at unix:///x.sock: connection refused"
            )
        );
    }
}
