//! [`SessionError`]: every way a call can fail, and the single table that
//! turns it into a `tonic::Status` with a `google.rpc.ErrorInfo` detail.
//! Messages are cut to [`MAX_STATUS_MESSAGE`] (1 KiB), to fit the answer's
//! headers. A database's failure is a `StorageError` of a backend-neutral
//! [`StorageKind`]: `Unavailable` and `Conflict` answer UNAVAILABLE,
//! `Other` INTERNAL.

use std::{collections::HashMap, time::Duration};

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};
use troupe_proto::ERROR_DOMAIN;

use crate::model::{BudgetLeft, Dimension, SessionId};

#[cfg(feature = "sqlx")]
mod sqlx;
#[cfg(feature = "sqlx")]
pub use self::sqlx::classify;

/// Machine-readable reason of a refusal, sent as `ErrorInfo.reason` and
/// kept in the audit log: the one type clients read too.
pub use troupe_proto::refusal::Reason;

/// Spawn quota left, reported with successful creates and quota refusals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaLeft {
    pub tree_sessions_remaining: u32,
    pub depth_remaining: u32,
    pub children_remaining: u32,
}

/// What a `BUDGET_EXCEEDED` refusal says: whose budget, which dimension,
/// its limit and what is used (settled and reserved), and what is left over
/// the whole path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetRefusal {
    pub session_id: SessionId,
    pub dimension: Dimension,
    pub limit: u64,
    pub used: u64,
    pub left: BudgetLeft,
}

impl BudgetRefusal {
    /// The refusal's `ErrorInfo` metadata.
    fn metadata(&self, metadata: &mut HashMap<String, String>) {
        metadata.insert(
            "budget_session_id".to_owned(),
            self.session_id.clone().into(),
        );
        metadata.insert(
            "budget_dimension".to_owned(),
            self.dimension.as_str().to_owned(),
        );
        metadata.insert("budget_limit".to_owned(), self.limit.to_string());
        metadata.insert("budget_used".to_owned(), self.used.to_string());
        let left = [
            ("cost_pico_usd_remaining", self.left.cost.map(|c| c.0)),
            ("tokens_remaining", self.left.tokens),
            ("model_calls_remaining", self.left.calls),
            ("wall_ms_remaining", self.left.wall_ms),
        ];
        for (key, value) in left {
            if let Some(value) = value {
                metadata.insert(key.to_owned(), value.to_string());
            }
        }
    }
}

/// How a database failed, as far as the caller is concerned: classified by
/// the backend (`error/sqlx.rs` for the sqlx ones), so that no type of
/// a database library reaches the rest of the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorageKind {
    /// The database cannot be reached for now (connection lost, pool timed
    /// out, shutting down): the call answers `UNAVAILABLE`, and the caller
    /// retries.
    Unavailable,
    /// The transaction lost to a concurrent one (serialization failure,
    /// deadlock, busy) and changed nothing: a backend may retry it; if it
    /// does not, the call answers `UNAVAILABLE`, and the caller retries.
    Conflict,
    /// Anything else: `INTERNAL`, logged, the details never sent.
    Other,
}

/// A failure of the database, with what the backend knows of it (for the
/// log only: it never reaches the caller).
#[derive(Clone, Debug, thiserror::Error)]
#[error("{}", match .kind {
    StorageKind::Unavailable | StorageKind::Conflict => "database unavailable",
    StorageKind::Other => "database error",
})]
pub struct StorageError {
    pub kind: StorageKind,
    /// The backend's own description.
    pub detail: String,
}

impl StorageError {
    pub fn new(kind: StorageKind, detail: impl Into<String>) -> Self {
        StorageError {
            kind,
            detail: detail.into(),
        }
    }
}

/// Every error of the session service.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// A rule refused the call; the message says which and what to do.
    #[error("{message}")]
    Refused {
        reason: Reason,
        message: String,
        quota: Option<QuotaLeft>,
        retry_after: Option<Duration>,
    },
    /// A budget refused a create or a model call (`BUDGET_EXCEEDED`).
    #[error("{message}")]
    BudgetExceeded {
        message: String,
        refusal: Box<BudgetRefusal>,
    },
    /// The session does not exist or the caller may not see it (the two are indistinguishable).
    #[error("session not found: {session_id}")]
    SessionNotFound { session_id: String },
    #[error("invalid {field}: {message}")]
    InvalidArgument {
        field: &'static str,
        message: String,
    },
    /// An agent definition sent to be stored is not valid; the message is
    /// the parser's, as for a file (`AGENT_INVALID`, but `INVALID_ARGUMENT`:
    /// the request is at fault, not the service's state).
    #[error("{0}")]
    InvalidAgent(String),
    /// The database failed the call; the backend says how (see [`StorageError`]).
    #[error("{0}")]
    Storage(StorageError),
    #[error("internal error: {0}")]
    Internal(String),
    /// A background write carried a fence that is no longer the lease's
    /// current term (taken over, expired): the writer is not the owner of
    /// the background work any more and must stop it.
    #[error("fenced: term {epoch} is no longer the owner of the background work")]
    Fenced { epoch: i64 },
}

impl SessionError {
    /// Whether this is a refused stale owner's write ([`SessionError::Fenced`]).
    pub fn is_fenced(&self) -> bool {
        matches!(self, SessionError::Fenced { .. })
    }

    /// Builds a refusal without quota or retry details.
    pub fn refused(reason: Reason, message: impl Into<String>) -> Self {
        SessionError::Refused {
            reason,
            message: message.into(),
            quota: None,
            retry_after: None,
        }
    }

    pub fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        SessionError::InvalidArgument {
            field,
            message: message.into(),
        }
    }

    /// A database failure the backend classified.
    pub fn storage(kind: StorageKind, detail: impl Into<String>) -> Self {
        SessionError::Storage(StorageError::new(kind, detail))
    }

    pub fn not_found(session_id: impl Into<String>) -> Self {
        SessionError::SessionNotFound {
            session_id: session_id.into(),
        }
    }

    /// Returns the machine-readable reason, as the audit log records it.
    pub fn reason(&self) -> Reason {
        match self {
            SessionError::Refused { reason, .. } => reason.clone(),
            SessionError::BudgetExceeded { .. } => Reason::BudgetExceeded,
            SessionError::SessionNotFound { .. } => Reason::SessionNotFound,
            SessionError::InvalidArgument { .. } => Reason::InvalidArgument,
            SessionError::InvalidAgent(_) => Reason::AgentInvalid,
            SessionError::Storage(e) => match e.kind {
                StorageKind::Unavailable | StorageKind::Conflict => Reason::Unavailable,
                StorageKind::Other => Reason::Internal,
            },
            SessionError::Internal(_) => Reason::Internal,
            SessionError::Fenced { .. } => Reason::Unavailable,
        }
    }
}

impl From<SessionError> for Status {
    fn from(err: SessionError) -> Status {
        let reason = err.reason();
        let mut metadata = HashMap::new();
        let mut details = ErrorDetails::new();
        let message = match &err {
            SessionError::Storage(e) => match e.kind {
                StorageKind::Unavailable | StorageKind::Conflict => {
                    tracing::warn!(error = %e.detail, kind = ?e.kind, "database unavailable");
                    "the database is unavailable; retry".to_owned()
                }
                StorageKind::Other => {
                    tracing::error!(error = %e.detail, "database error");
                    "internal error".to_owned()
                }
            },
            SessionError::Internal(e) => {
                tracing::error!(error = %e, "internal error");
                "internal error".to_owned()
            }
            SessionError::InvalidArgument { field, .. } => {
                metadata.insert("field".to_owned(), (*field).to_owned());
                err.to_string()
            }
            SessionError::InvalidAgent(_) => {
                metadata.insert("field".to_owned(), "definition".to_owned());
                err.to_string()
            }
            SessionError::Refused {
                quota, retry_after, ..
            } => {
                if let Some(q) = quota {
                    metadata.insert(
                        "tree_sessions_remaining".to_owned(),
                        q.tree_sessions_remaining.to_string(),
                    );
                    metadata.insert("depth_remaining".to_owned(), q.depth_remaining.to_string());
                    metadata.insert(
                        "children_remaining".to_owned(),
                        q.children_remaining.to_string(),
                    );
                }
                if let Some(after) = retry_after {
                    metadata.insert("retry_after_ms".to_owned(), after.as_millis().to_string());
                    details.set_retry_info(Some(*after));
                }
                err.to_string()
            }
            SessionError::BudgetExceeded { refusal, .. } => {
                refusal.metadata(&mut metadata);
                err.to_string()
            }
            SessionError::SessionNotFound { .. } | SessionError::Fenced { .. } => err.to_string(),
        };
        let message = bounded(message);
        details.set_error_info(reason.as_str(), ERROR_DOMAIN, metadata);
        let code = match err {
            SessionError::InvalidAgent(_) => Code::InvalidArgument,
            _ => reason.code(),
        };
        Status::with_error_details(code, message, details)
    }
}

/// The longest message a refusal carries. A message can echo what the
/// caller sent (a session id); it goes back in a header, twice (message and
/// details), and a header too large breaks the caller's connection instead
/// of answering it.
pub const MAX_STATUS_MESSAGE: usize = 1024;

/// Returns `message`, cut to [`MAX_STATUS_MESSAGE`] bytes (at a character).
fn bounded(mut message: String) -> String {
    if message.len() > MAX_STATUS_MESSAGE {
        let mut end = MAX_STATUS_MESSAGE - '…'.len_utf8();
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    message
}

/// Parses a value's stored text (`what` names it for the log): an unknown
/// text is a storage error, never a panic.
pub fn parse_stored<T>(
    what: &str,
    text: &str,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Result<T, SessionError> {
    parse(text).ok_or_else(|| {
        SessionError::storage(
            StorageKind::Other,
            format!("unknown stored {what} {text:?}"),
        )
    })
}
