//! How a failed command is reported: `error: <message> (reason: ..)` on
//! stderr, or `{"error": {...}}` on stdout with `--json`. A gRPC status is
//! shown with its `google.rpc.ErrorInfo` reason and metadata, decoded and
//! worded by [`troupe_proto::refusal`].

use serde_json::{Map, Value, json};
use tonic::{Code, Status};
use troupe_proto::refusal::{self, Reason, Refusal};

use crate::{connect::TokenOrigin, safe};

/// What the report needs to know beyond the error, for hints.
#[derive(Debug, Default)]
pub struct Setting {
    pub endpoint: String,
    pub token_origin: Option<TokenOrigin>,
}

/// Marks an error that was already reported (a stream that printed its own
/// resume hint); `main` only sets the exit code.
#[derive(Debug)]
pub struct Reported;

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("error already reported")
    }
}

impl std::error::Error for Reported {}

/// A failure, reduced to what is shown.
#[derive(Debug, PartialEq, Eq)]
pub struct Failure {
    pub code: Option<&'static str>,
    pub message: String,
    pub reason: Option<Reason>,
    /// Sorted by key.
    pub metadata: Vec<(String, String)>,
    pub hint: Option<String>,
}

impl Failure {
    pub fn from_error(err: &anyhow::Error, setting: &Setting) -> Self {
        match err.downcast_ref::<Status>() {
            Some(status) => Failure::from_status(status, setting),
            None => Failure {
                code: None,
                message: format!("{err:#}"),
                reason: None,
                metadata: Vec::new(),
                hint: None,
            },
        }
    }

    pub fn from_status(status: &Status, setting: &Setting) -> Self {
        let Refusal {
            code,
            message,
            reason,
            metadata,
        } = Refusal::from_status(status);
        let hint = match (status.code(), &reason) {
            (Code::Unavailable, None) => Some(format!(
                "is troupe-session running at {}?",
                setting.endpoint
            )),
            (Code::Unauthenticated, Some(Reason::TokenInvalid)) => {
                setting.token_origin.as_ref().map(|origin| {
                    format!("the token from {origin} is not one this server issued or accepts")
                })
            }
            _ => None,
        };
        Failure {
            code: Some(code),
            message,
            reason,
            metadata,
            hint,
        }
    }

    /// Returns the human form: `error: <message> (reason: X, k=v)` and maybe a hint line.
    pub fn text(&self) -> String {
        let mut out = format!(
            "error: {}",
            refusal::describe(&self.message, self.reason.as_ref(), &self.metadata)
        );
        if let Some(hint) = &self.hint {
            out.push_str(&format!("\nhint: {hint}"));
        }
        out
    }

    /// Returns the `--json` form: `{"error": {"code", "message", "reason", "metadata"}}`.
    pub fn json(&self) -> Value {
        let mut error = Map::new();
        if let Some(code) = self.code {
            error.insert("code".into(), code.into());
        }
        error.insert("message".into(), self.message.clone().into());
        if let Some(reason) = &self.reason {
            error.insert("reason".into(), reason.as_str().into());
            let metadata: Map<String, Value> = self
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            error.insert("metadata".into(), Value::Object(metadata));
        }
        if let Some(hint) = &self.hint {
            error.insert("hint".into(), hint.clone().into());
        }
        json!({ "error": error })
    }
}

/// Reports an error: text on stderr, or JSON on stdout with `--json`.
pub fn report(err: &anyhow::Error, json: bool, setting: &Setting) {
    let failure = Failure::from_error(err, setting);
    if json {
        let _ = crate::out::json_line(&failure.json());
    } else {
        eprintln!("{}", safe::block(&failure.text()));
    }
}

/// Returns true when the error is stdout closing under us (`troupe ... | head`),
/// not a call's connection to the service broken (a server killed midway),
/// which is a failure to report.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    let from_a_call = err
        .chain()
        .any(|cause| cause.is::<tonic::Status>() || cause.is::<tonic::transport::Error>());
    !from_a_call
        && err.chain().any(|cause| {
            cause
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
        })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tonic_types::{ErrorDetails, StatusExt};

    use super::*;

    #[test]
    fn refusal_shows_reason_and_sorted_metadata() {
        let metadata = HashMap::from([
            ("tree_sessions_remaining".to_owned(), "3".to_owned()),
            ("depth_remaining".to_owned(), "0".to_owned()),
        ]);
        let status = Status::with_error_details(
            Code::ResourceExhausted,
            "depth limit reached",
            ErrorDetails::with_error_info("DEPTH_EXCEEDED", "troupe", metadata),
        );
        let failure = Failure::from_status(&status, &Setting::default());
        assert_eq!(
            failure.text(),
            "error: depth limit reached (reason: DEPTH_EXCEEDED, depth_remaining=0, \
             tree_sessions_remaining=3)"
        );
        let json = failure.json();
        assert_eq!(json["error"]["code"], "RESOURCE_EXHAUSTED");
        assert_eq!(json["error"]["reason"], "DEPTH_EXCEEDED");
        assert_eq!(json["error"]["metadata"]["depth_remaining"], "0");
    }

    #[test]
    fn unavailable_without_details_hints_at_the_server() {
        let setting = Setting {
            endpoint: "http://127.0.0.1:7400".into(),
            token_origin: None,
        };
        let failure = Failure::from_status(&Status::unavailable("transport error"), &setting);
        assert_eq!(
            failure.text(),
            "error: transport error\nhint: is troupe-session running at http://127.0.0.1:7400?"
        );
    }
}
