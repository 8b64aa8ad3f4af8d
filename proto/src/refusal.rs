//! What a refused call says, in one form for every client: a gRPC status
//! reduced to its code name, message, and the `google.rpc.ErrorInfo` reason
//! and metadata (what is left of a quota, the field at fault). The CLI prints
//! it; the MCP bridge hands it to the agent as a tool error.

use tonic::{Code, Status};
use tonic_types::StatusExt;

/// A refusal, decoded from a [`Status`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The canonical gRPC code name (`RESOURCE_EXHAUSTED`, ...).
    pub code: &'static str,
    /// The status message, or the code's description when it has none.
    pub message: String,
    /// The `ErrorInfo` reason (`DEPTH_EXCEEDED`, ...), when the status has one.
    pub reason: Option<String>,
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
            reason: info.map(|i| i.reason),
            metadata,
        }
    }

    /// Returns `<message> (reason: X, k=v, ...)`, or the message alone
    /// when the status carries no reason.
    pub fn text(&self) -> String {
        describe(&self.message, self.reason.as_deref(), &self.metadata)
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
pub fn describe(message: &str, reason: Option<&str>, metadata: &[(String, String)]) -> String {
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
