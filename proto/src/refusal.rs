//! What a refused call says, in one form for every client: a gRPC status
//! reduced to its code name, message, and the `google.rpc.ErrorInfo` reason
//! and metadata (what is left of a quota, the field at fault). The CLI prints
//! it; the MCP bridge hands it to the agent as a tool error.
//!
//! Clients match on [`Reason`], the type the session service refuses with.

use tonic::{Code, Status};
use tonic_types::StatusExt;

/// The `google.rpc.ErrorInfo` reason of a refusal: what rule refused the
/// call. The session service sends all but [`Reason::SessionHintMismatch`],
/// which the MCP bridge gives its own refusals; [`Reason::Unknown`] keeps a
/// reason this build does not know (a newer server's).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    TokenMissing,
    TokenInvalid,
    TokenExpired,
    TokenRevoked,
    OperatorOnly,
    SessionOnly,
    ParentOverrideForbidden,
    NotADescendant,
    TrustEscalation,
    ScopeEscalation,
    DepthExceeded,
    TreeQuotaExceeded,
    ChildQuotaExceeded,
    WorkspaceQuotaExceeded,
    RateLimited,
    ParentNotRunning,
    /// A root session asked for its parent (`ReplyToParent`): it has none.
    NoParent,
    SessionEnded,
    SessionNotFound,
    WorkspaceNotFound,
    AgentNotFound,
    AgentInvalid,
    InvalidArgument,
    IdempotencyConflict,
    CursorExpired,
    Unavailable,
    Internal,
    /// A session's runner stopped renewing its registration: the session
    /// failed with end reason `runner_lost` (shown in the audit log).
    RunnerLost,
    /// A budget on the session's path is spent, or a child asked more than
    /// is left (`budget_*` and `*_remaining` metadata).
    BudgetExceeded,
    /// A broadcast or group post would reach more sessions than one message
    /// may, or a group would grow past that.
    FanOutExceeded,
    /// The recipient's inbox holds as many unread bytes as one may.
    InboxFull,
    /// No group of that name that the caller is a member of.
    GroupNotFound,
    /// Another session's group has that name in the workspace.
    GroupExists,
    /// The MCP bridge's own: the `X-Agent-Session-Id` hint names a session
    /// other than the token's.
    SessionHintMismatch,
    /// A reason this build does not know, as sent.
    Unknown(String),
}

impl Reason {
    /// Every reason this build knows.
    pub const KNOWN: &[Reason] = &[
        Reason::TokenMissing,
        Reason::TokenInvalid,
        Reason::TokenExpired,
        Reason::TokenRevoked,
        Reason::OperatorOnly,
        Reason::SessionOnly,
        Reason::ParentOverrideForbidden,
        Reason::NotADescendant,
        Reason::TrustEscalation,
        Reason::ScopeEscalation,
        Reason::DepthExceeded,
        Reason::TreeQuotaExceeded,
        Reason::ChildQuotaExceeded,
        Reason::WorkspaceQuotaExceeded,
        Reason::RateLimited,
        Reason::ParentNotRunning,
        Reason::NoParent,
        Reason::SessionEnded,
        Reason::SessionNotFound,
        Reason::WorkspaceNotFound,
        Reason::AgentNotFound,
        Reason::AgentInvalid,
        Reason::InvalidArgument,
        Reason::IdempotencyConflict,
        Reason::CursorExpired,
        Reason::Unavailable,
        Reason::Internal,
        Reason::RunnerLost,
        Reason::BudgetExceeded,
        Reason::FanOutExceeded,
        Reason::InboxFull,
        Reason::GroupNotFound,
        Reason::GroupExists,
        Reason::SessionHintMismatch,
    ];

    /// The gRPC code a refusal of this reason is sent with.
    pub fn code(&self) -> Code {
        match self {
            Reason::TokenMissing
            | Reason::TokenInvalid
            | Reason::TokenExpired
            | Reason::TokenRevoked => Code::Unauthenticated,
            Reason::OperatorOnly
            | Reason::SessionOnly
            | Reason::ParentOverrideForbidden
            | Reason::NotADescendant
            | Reason::TrustEscalation
            | Reason::ScopeEscalation => Code::PermissionDenied,
            Reason::DepthExceeded
            | Reason::TreeQuotaExceeded
            | Reason::ChildQuotaExceeded
            | Reason::WorkspaceQuotaExceeded
            | Reason::RateLimited
            | Reason::BudgetExceeded
            | Reason::FanOutExceeded
            | Reason::InboxFull => Code::ResourceExhausted,
            Reason::ParentNotRunning
            | Reason::NoParent
            | Reason::SessionEnded
            | Reason::AgentInvalid => Code::FailedPrecondition,
            Reason::SessionNotFound
            | Reason::WorkspaceNotFound
            | Reason::AgentNotFound
            | Reason::GroupNotFound => Code::NotFound,
            Reason::InvalidArgument => Code::InvalidArgument,
            Reason::IdempotencyConflict | Reason::GroupExists => Code::AlreadyExists,
            Reason::CursorExpired => Code::OutOfRange,
            Reason::Unavailable | Reason::RunnerLost => Code::Unavailable,
            Reason::Internal => Code::Internal,
            Reason::SessionHintMismatch => Code::PermissionDenied,
            Reason::Unknown(_) => Code::Unknown,
        }
    }

    /// Parses a wire name; one this build does not know is [`Reason::Unknown`].
    pub fn parse(wire: &str) -> Self {
        match wire {
            "TOKEN_MISSING" => Reason::TokenMissing,
            "TOKEN_INVALID" => Reason::TokenInvalid,
            "TOKEN_EXPIRED" => Reason::TokenExpired,
            "TOKEN_REVOKED" => Reason::TokenRevoked,
            "OPERATOR_ONLY" => Reason::OperatorOnly,
            "SESSION_ONLY" => Reason::SessionOnly,
            "PARENT_OVERRIDE_FORBIDDEN" => Reason::ParentOverrideForbidden,
            "NOT_A_DESCENDANT" => Reason::NotADescendant,
            "TRUST_ESCALATION" => Reason::TrustEscalation,
            "SCOPE_ESCALATION" => Reason::ScopeEscalation,
            "DEPTH_EXCEEDED" => Reason::DepthExceeded,
            "TREE_QUOTA_EXCEEDED" => Reason::TreeQuotaExceeded,
            "CHILD_QUOTA_EXCEEDED" => Reason::ChildQuotaExceeded,
            "WORKSPACE_QUOTA_EXCEEDED" => Reason::WorkspaceQuotaExceeded,
            "RATE_LIMITED" => Reason::RateLimited,
            "PARENT_NOT_RUNNING" => Reason::ParentNotRunning,
            "NO_PARENT" => Reason::NoParent,
            "SESSION_ENDED" => Reason::SessionEnded,
            "SESSION_NOT_FOUND" => Reason::SessionNotFound,
            "WORKSPACE_NOT_FOUND" => Reason::WorkspaceNotFound,
            "AGENT_NOT_FOUND" => Reason::AgentNotFound,
            "AGENT_INVALID" => Reason::AgentInvalid,
            "INVALID_ARGUMENT" => Reason::InvalidArgument,
            "IDEMPOTENCY_CONFLICT" => Reason::IdempotencyConflict,
            "CURSOR_EXPIRED" => Reason::CursorExpired,
            "UNAVAILABLE" => Reason::Unavailable,
            "INTERNAL" => Reason::Internal,
            "RUNNER_LOST" => Reason::RunnerLost,
            "BUDGET_EXCEEDED" => Reason::BudgetExceeded,
            "FAN_OUT_EXCEEDED" => Reason::FanOutExceeded,
            "INBOX_FULL" => Reason::InboxFull,
            "GROUP_NOT_FOUND" => Reason::GroupNotFound,
            "GROUP_EXISTS" => Reason::GroupExists,
            "SESSION_HINT_MISMATCH" => Reason::SessionHintMismatch,
            other => Reason::Unknown(other.to_owned()),
        }
    }

    /// Returns the wire name (`DEPTH_EXCEEDED`, ...).
    pub fn as_str(&self) -> &str {
        match self {
            Reason::TokenMissing => "TOKEN_MISSING",
            Reason::TokenInvalid => "TOKEN_INVALID",
            Reason::TokenExpired => "TOKEN_EXPIRED",
            Reason::TokenRevoked => "TOKEN_REVOKED",
            Reason::OperatorOnly => "OPERATOR_ONLY",
            Reason::SessionOnly => "SESSION_ONLY",
            Reason::ParentOverrideForbidden => "PARENT_OVERRIDE_FORBIDDEN",
            Reason::NotADescendant => "NOT_A_DESCENDANT",
            Reason::TrustEscalation => "TRUST_ESCALATION",
            Reason::ScopeEscalation => "SCOPE_ESCALATION",
            Reason::DepthExceeded => "DEPTH_EXCEEDED",
            Reason::TreeQuotaExceeded => "TREE_QUOTA_EXCEEDED",
            Reason::ChildQuotaExceeded => "CHILD_QUOTA_EXCEEDED",
            Reason::WorkspaceQuotaExceeded => "WORKSPACE_QUOTA_EXCEEDED",
            Reason::RateLimited => "RATE_LIMITED",
            Reason::ParentNotRunning => "PARENT_NOT_RUNNING",
            Reason::NoParent => "NO_PARENT",
            Reason::SessionEnded => "SESSION_ENDED",
            Reason::SessionNotFound => "SESSION_NOT_FOUND",
            Reason::WorkspaceNotFound => "WORKSPACE_NOT_FOUND",
            Reason::AgentNotFound => "AGENT_NOT_FOUND",
            Reason::AgentInvalid => "AGENT_INVALID",
            Reason::InvalidArgument => "INVALID_ARGUMENT",
            Reason::IdempotencyConflict => "IDEMPOTENCY_CONFLICT",
            Reason::CursorExpired => "CURSOR_EXPIRED",
            Reason::Unavailable => "UNAVAILABLE",
            Reason::Internal => "INTERNAL",
            Reason::RunnerLost => "RUNNER_LOST",
            Reason::BudgetExceeded => "BUDGET_EXCEEDED",
            Reason::FanOutExceeded => "FAN_OUT_EXCEEDED",
            Reason::InboxFull => "INBOX_FULL",
            Reason::GroupNotFound => "GROUP_NOT_FOUND",
            Reason::GroupExists => "GROUP_EXISTS",
            Reason::SessionHintMismatch => "SESSION_HINT_MISMATCH",
            Reason::Unknown(wire) => wire,
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refusal, decoded from a [`Status`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The canonical gRPC code name (`RESOURCE_EXHAUSTED`, ...).
    pub code: &'static str,
    /// The status message, or the code's description when it has none.
    pub message: String,
    /// The `ErrorInfo` reason (`DEPTH_EXCEEDED`, ...), when the status has one.
    pub reason: Option<Reason>,
    /// The `ErrorInfo` metadata, sorted by key.
    pub metadata: Vec<(String, String)>,
}

impl Refusal {
    /// Decodes `status` and its `ErrorInfo` detail, if any.
    pub fn from_status(status: &Status) -> Self {
        let info = status.get_details_error_info();
        let mut metadata: Vec<_> = info
            .as_ref()
            .map(|i| i.metadata.clone().into_iter().collect())
            .unwrap_or_default();
        metadata.sort();
        let message = if status.message().is_empty() {
            status.code().description().to_owned()
        } else {
            status.message().to_owned()
        };
        Refusal {
            code: code_str(status.code()),
            message,
            reason: info.map(|i| Reason::parse(&i.reason)),
            metadata,
        }
    }

    /// Returns `<message> (reason: X, k=v, ...)`, or the message alone
    /// when the status carries no reason.
    pub fn text(&self) -> String {
        describe(&self.message, self.reason.as_ref(), &self.metadata)
    }

    /// Returns one metadata value.
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.metadata
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Returns `<message> (reason: X, k=v, ...)`, or `message` alone without a
/// reason: the one wording of a refusal.
pub fn describe(message: &str, reason: Option<&Reason>, metadata: &[(String, String)]) -> String {
    let mut out = message.to_owned();
    if let Some(reason) = reason {
        out.push_str(&format!(" (reason: {reason}"));
        for (key, value) in metadata {
            out.push_str(&format!(", {key}={value}"));
        }
        out.push(')');
    }
    out
}

/// Returns the canonical gRPC name of a code (`NOT_FOUND`, ...).
pub fn code_str(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tonic_types::ErrorDetails;

    use super::*;

    #[test]
    fn reason_and_sorted_metadata() {
        let metadata = HashMap::from([
            ("tree_sessions_remaining".to_owned(), "3".to_owned()),
            ("depth_remaining".to_owned(), "0".to_owned()),
        ]);
        let status = Status::with_error_details(
            Code::ResourceExhausted,
            "depth limit reached",
            ErrorDetails::with_error_info("DEPTH_EXCEEDED", "troupe", metadata),
        );
        let refusal = Refusal::from_status(&status);
        assert_eq!(refusal.code, "RESOURCE_EXHAUSTED");
        assert_eq!(
            refusal.text(),
            "depth limit reached (reason: DEPTH_EXCEEDED, depth_remaining=0, \
             tree_sessions_remaining=3)"
        );
        assert_eq!(refusal.metadata("depth_remaining"), Some("0"));
        assert_eq!(refusal.reason, Some(Reason::DepthExceeded));
    }

    #[test]
    fn reasons_round_trip_and_unknown_ones_are_kept() {
        for reason in Reason::KNOWN {
            assert_eq!(&Reason::parse(reason.as_str()), reason);
        }
        let newer = Reason::parse("SOMETHING_NEWER");
        assert_eq!(newer, Reason::Unknown("SOMETHING_NEWER".to_owned()));
        assert_eq!(newer.as_str(), "SOMETHING_NEWER");
    }

    #[test]
    fn plain_status_is_its_message() {
        let refusal = Refusal::from_status(&Status::unavailable("transport error"));
        assert_eq!(refusal.code, "UNAVAILABLE");
        assert_eq!(refusal.reason, None);
        assert_eq!(refusal.text(), "transport error");
        let empty = Refusal::from_status(&Status::new(Code::NotFound, ""));
        assert_eq!(empty.text(), Code::NotFound.description());
    }
}
