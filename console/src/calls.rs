//! How the console acts: through the session service's own gRPC handlers,
//! in process, with the operator's token on each request, so that every
//! rule, audit entry and event is what the same call over gRPC gives. And
//! how their refusals become HTTP answers ([`ApiError`]: gRPC's HTTP
//! mapping of the status, a JSON body, never cached).

use axum::{
    Json,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use tonic::{Code, Request, Status, metadata::MetadataValue};
use troupe_proto::refusal::Refusal;

/// A request of the operator: `message` with `authorization: Bearer
/// <operator token>`, as the CLI sends it.
pub fn as_operator<T>(operator_token: &str, message: T) -> Result<Request<T>, ApiError> {
    let mut request = Request::new(message);
    let value = MetadataValue::try_from(format!("Bearer {operator_token}"))
        .map_err(|_| ApiError::internal("the operator token cannot be sent"))?;
    request.metadata_mut().insert("authorization", value);
    Ok(request)
}

/// A refusal as the console answers it: an HTTP status and a JSON body
/// `{"code", "message", "reason"}`, never cached.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub reason: Option<String>,
    /// Seconds, for a `Retry-After` header.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            reason: None,
            retry_after: None,
        }
    }

    /// Tells the client when to try again (`Retry-After`, seconds).
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", message)
    }

    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "PERMISSION_DENIED", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", message)
    }
}

impl From<Status> for ApiError {
    fn from(status: Status) -> Self {
        let refusal = Refusal::from_status(&status);
        ApiError {
            status: http_status(status.code()),
            code: refusal.code,
            message: refusal.message,
            reason: refusal.reason.map(|r| r.as_str().to_owned()),
            retry_after: None,
        }
    }
}

impl From<troupe_domain::error::SessionError> for ApiError {
    fn from(err: troupe_domain::error::SessionError) -> Self {
        ApiError::from(Status::from(err))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "code": self.code,
            "message": self.message,
            "reason": self.reason,
        });
        let mut response = (self.status, Json(body)).into_response();
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// The HTTP status of a gRPC code, as gRPC's HTTP mapping has it.
fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
            StatusCode::BAD_REQUEST
        }
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}
