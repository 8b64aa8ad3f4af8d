//! Errors in each provider's own shape, so the agent's client prints them:
//! Anthropic's `{"type":"error","error":{"type","message"}}` and OpenAI's
//! `{"error":{"message","type","code"}}` (Chat Completions and Responses
//! alike), Gemini's `{"error":{"code","message","status"}}`, with the HTTP
//! status each API gives that kind of error. In a stream already under
//! way, each API's error event: Anthropic's `error`, a Chat Completions
//! chunk with an `error`, a Responses `error` event, a Gemini chunk that is
//! its error.

use axum::{
    body::Body,
    http::{StatusCode, header},
    response::Response,
};
use serde_json::json;

use troupe_domain::error::{Reason, SessionError};

/// Which API a route speaks to its client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// Anthropic Messages.
    Anthropic,
    /// OpenAI Chat Completions.
    Openai,
    /// OpenAI Responses.
    Responses,
    /// Google's Gemini API (`generateContent` and its kin).
    Gemini,
}

/// What went wrong, in terms every API has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The request is malformed (400).
    Invalid,
    /// No token, or one that is not a live session's (401).
    Unauthenticated,
    /// A valid caller that may not do this (403): a model not allowed.
    Forbidden,
    /// No such route (404).
    NotFound,
    /// The request's body is past the gateway's bound (413).
    TooLarge,
    /// The caller has too many bytes of requests in flight (429): a retry
    /// later may pass.
    Busy,
    /// A budget refused the call (Anthropic 400, like its "credit balance
    /// is too low"; OpenAI 429 `insufficient_quota`): not worth a retry.
    Budget,
    /// The provider could not be reached or broke off (502).
    Upstream,
    /// The provider did not answer in time (504).
    Timeout,
    /// The gateway failed (500).
    Internal,
}

/// An error answer, before it takes an API's shape.
#[derive(Debug)]
pub struct ApiError {
    pub kind: Kind,
    pub message: String,
}

impl ApiError {
    pub fn new(kind: Kind, message: impl Into<String>) -> ApiError {
        ApiError {
            kind,
            message: message.into(),
        }
    }

    /// The gateway's answer to a refusal of the ledger's rules.
    pub fn from_session(err: &SessionError) -> ApiError {
        let kind = match err {
            SessionError::BudgetExceeded { .. } => Kind::Budget,
            SessionError::Refused { reason, .. } => match reason {
                Reason::TokenMissing
                | Reason::TokenInvalid
                | Reason::TokenExpired
                | Reason::TokenRevoked
                | Reason::SessionEnded => Kind::Unauthenticated,
                _ => Kind::Forbidden,
            },
            SessionError::SessionNotFound { .. } => Kind::Unauthenticated,
            SessionError::InvalidArgument { .. } | SessionError::InvalidAgent(_) => Kind::Invalid,
            SessionError::Storage(_) | SessionError::Internal(_) | SessionError::Fenced { .. } => {
                Kind::Internal
            }
        };
        let message = match kind {
            // Database details stay in the log.
            Kind::Internal => "internal error of the gateway".to_owned(),
            _ => err.to_string(),
        };
        ApiError { kind, message }
    }

    pub fn status(&self, api: Api) -> StatusCode {
        match (self.kind, api) {
            (Kind::Invalid, _) => StatusCode::BAD_REQUEST,
            (Kind::Unauthenticated, _) => StatusCode::UNAUTHORIZED,
            (Kind::Forbidden, _) => StatusCode::FORBIDDEN,
            (Kind::NotFound, _) => StatusCode::NOT_FOUND,
            (Kind::TooLarge, _) => StatusCode::PAYLOAD_TOO_LARGE,
            (Kind::Busy, _) => StatusCode::TOO_MANY_REQUESTS,
            (Kind::Budget, Api::Anthropic) => StatusCode::BAD_REQUEST,
            (Kind::Budget, Api::Openai | Api::Responses | Api::Gemini) => {
                StatusCode::TOO_MANY_REQUESTS
            }
            (Kind::Upstream, _) => StatusCode::BAD_GATEWAY,
            (Kind::Timeout, _) => StatusCode::GATEWAY_TIMEOUT,
            (Kind::Internal, _) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The error's JSON body in `api`'s shape.
    pub fn body(&self, api: Api) -> serde_json::Value {
        match api {
            Api::Anthropic => {
                let kind = match self.kind {
                    Kind::Invalid | Kind::Budget => "invalid_request_error",
                    Kind::Unauthenticated => "authentication_error",
                    Kind::Forbidden => "permission_error",
                    Kind::NotFound => "not_found_error",
                    Kind::TooLarge => "request_too_large",
                    Kind::Busy => "rate_limit_error",
                    Kind::Upstream | Kind::Timeout | Kind::Internal => "api_error",
                };
                json!({"type": "error", "error": {"type": kind, "message": self.message}})
            }
            Api::Openai | Api::Responses => {
                let (kind, code) = self.openai_kind();
                json!({"error": {"message": self.message, "type": kind, "param": null, "code": code}})
            }
            Api::Gemini => {
                let status = match self.kind {
                    Kind::Invalid | Kind::TooLarge => "INVALID_ARGUMENT",
                    Kind::Unauthenticated => "UNAUTHENTICATED",
                    Kind::Forbidden => "PERMISSION_DENIED",
                    Kind::NotFound => "NOT_FOUND",
                    Kind::Busy | Kind::Budget => "RESOURCE_EXHAUSTED",
                    Kind::Upstream => "UNAVAILABLE",
                    Kind::Timeout => "DEADLINE_EXCEEDED",
                    Kind::Internal => "INTERNAL",
                };
                let code = self.status(api).as_u16();
                json!({"error": {"code": code, "message": self.message, "status": status}})
            }
        }
    }

    /// The error's `type` and `code` in OpenAI's words.
    fn openai_kind(&self) -> (&'static str, Option<&'static str>) {
        match self.kind {
            Kind::Invalid => ("invalid_request_error", None),
            Kind::Unauthenticated => ("invalid_request_error", Some("invalid_api_key")),
            Kind::Forbidden => ("invalid_request_error", Some("model_not_allowed")),
            Kind::NotFound => ("invalid_request_error", Some("unknown_url")),
            Kind::TooLarge => ("invalid_request_error", Some("request_too_large")),
            Kind::Busy => ("requests", Some("rate_limit_exceeded")),
            Kind::Budget => ("insufficient_quota", Some("insufficient_quota")),
            Kind::Upstream | Kind::Timeout | Kind::Internal => ("server_error", None),
        }
    }

    /// The error as an answer.
    pub fn response(&self, api: Api) -> Response {
        Response::builder()
            .status(self.status(api))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(self.body(api).to_string()))
            .unwrap_or_default()
    }

    /// The error as the last event of a stream already under way.
    pub fn stream_event(&self, api: Api) -> String {
        match api {
            Api::Anthropic => format!("event: error\ndata: {}\n\n", self.body(api)),
            Api::Openai | Api::Gemini => format!("data: {}\n\n", self.body(api)),
            Api::Responses => {
                let (kind, code) = self.openai_kind();
                let event = json!({"type": "error", "code": code.unwrap_or(kind),
                                   "message": self.message, "param": null});
                format!("event: error\ndata: {event}\n\n")
            }
        }
    }
}
