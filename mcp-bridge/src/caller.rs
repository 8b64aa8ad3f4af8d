//! Who is calling: the token a tool call is made with, and the trace it
//! belongs to (the agent's `TRACEPARENT` on stdio, the request's
//! `traceparent` header over HTTP), forwarded so the agent's trace continues
//! in the session service.
//!
//! On stdio the bridge serves one session: its token comes from the
//! environment the runner gave the agent. Over HTTP each request brings its
//! own `Authorization: Bearer <token>`, so one endpoint serves any number of
//! sessions, each acting as itself.
//!
//! `X-Agent-Session-Id` (ADR-005) is accepted over HTTP only as a hint: when
//! present it must name the token's own session, or the call is refused
//! before anything is forwarded. To learn the token's session the bridge
//! reads the `sub` claim of the token's payload *without* verifying it. That
//! reading grants nothing: the session service verifies the token on every
//! forwarded call and acts only as the session the verified token names, so
//! a forged `sub` can only get a call refused there. The check exists to
//! catch a client configured with one session's header and another's token.

use axum::http::{HeaderMap, request::Parts};
use base64::Engine;
use rmcp::model::Extensions;
use tonic::metadata::AsciiMetadataValue;
use troupe_proto::refusal::Reason;

use crate::failure::ToolFailure;

/// The header that names, as a hint, the calling session.
pub const SESSION_HINT_HEADER: &str = "x-agent-session-id";

/// The header (and gRPC metadata key) of the W3C trace context.
pub const TRACEPARENT_HEADER: &str = "traceparent";

/// Where tool calls get their token.
#[derive(Clone, Debug)]
pub enum Identity {
    /// One session for the bridge's life (stdio), in one trace if the agent
    /// was given one.
    Fixed {
        authorization: AsciiMetadataValue,
        traceparent: Option<AsciiMetadataValue>,
    },
    /// The token (and trace context) of each HTTP request.
    PerRequest,
}

impl Identity {
    /// The identity of a stdio bridge: `token`, sent as `Bearer <token>`,
    /// and the agent's `traceparent` (ignored unless it is header text).
    pub fn fixed(token: &str, traceparent: Option<&str>) -> anyhow::Result<Identity> {
        let authorization = bearer_value(token).map_err(|f| anyhow::anyhow!("{}", f.message))?;
        Ok(Identity::Fixed {
            authorization,
            traceparent: traceparent.and_then(|t| t.trim().parse().ok()),
        })
    }

    /// The trace context to forward with a call, if the caller has one.
    pub fn traceparent(&self, extensions: &Extensions) -> Option<AsciiMetadataValue> {
        match self {
            Identity::Fixed { traceparent, .. } => traceparent.clone(),
            Identity::PerRequest => extensions
                .get::<Parts>()
                .and_then(|parts| parts.headers.get(TRACEPARENT_HEADER))
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.trim().parse().ok()),
        }
    }

    /// Returns the `authorization` value for a call whose request extensions
    /// are `extensions` (they hold the HTTP request's parts over HTTP).
    pub fn authorization(
        &self,
        extensions: &Extensions,
    ) -> Result<AsciiMetadataValue, ToolFailure> {
        match self {
            Identity::Fixed { authorization, .. } => Ok(authorization.clone()),
            Identity::PerRequest => match extensions.get::<Parts>() {
                Some(parts) => from_headers(&parts.headers),
                None => Err(missing_token()),
            },
        }
    }
}

/// Reads the bearer token of an HTTP request and checks the session hint against it.
pub fn from_headers(headers: &HeaderMap) -> Result<AsciiMetadataValue, ToolFailure> {
    let Some(value) = headers.get(axum::http::header::AUTHORIZATION) else {
        return Err(missing_token());
    };
    let value = value.to_str().map_err(|_| malformed_authorization())?;
    let token = match value.trim().split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
        _ => return Err(malformed_authorization()),
    };
    if token.is_empty() {
        return Err(missing_token());
    }
    if let Some(hint) = headers.get(SESSION_HINT_HEADER) {
        let hint = hint.to_str().unwrap_or_default().trim();
        check_hint(hint, token)?;
    }
    bearer_value(token)
}

/// Refuses a hint that does not name the token's session.
fn check_hint(hint: &str, token: &str) -> Result<(), ToolFailure> {
    if hint.is_empty() {
        return Ok(());
    }
    match unverified_subject(token) {
        Some(subject) if subject == hint => Ok(()),
        Some(subject) => Err(ToolFailure::bridge(
            "PERMISSION_DENIED",
            Reason::SessionHintMismatch,
            format!(
                "X-Agent-Session-Id says {hint:?} but the bearer token belongs to session \
                 {subject:?}; nothing was forwarded"
            ),
        )
        .with_advice(
            "The token decides who is calling; the header is only a check of it. Send this \
             session's own id in X-Agent-Session-Id, or leave the header out.",
        )),
        None => Err(ToolFailure::bridge(
            "PERMISSION_DENIED",
            Reason::SessionHintMismatch,
            format!(
                "X-Agent-Session-Id says {hint:?} but the bearer token is not a session token; \
                 nothing was forwarded"
            ),
        )
        .with_advice("Send a session token, or leave X-Agent-Session-Id out.")),
    }
}

/// Returns the `sub` claim of a JWT's payload, unverified (see the module docs).
pub fn unverified_subject(token: &str) -> Option<String> {
    let mut segments = token.split('.');
    let (_header, payload, _signature) = (segments.next()?, segments.next()?, segments.next()?);
    if segments.next().is_some() {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims.get("sub")?.as_str().map(str::to_owned)
}

fn bearer_value(token: &str) -> Result<AsciiMetadataValue, ToolFailure> {
    format!("Bearer {token}").parse().map_err(|_| {
        ToolFailure::bridge(
            "UNAUTHENTICATED",
            Reason::TokenInvalid,
            "the session token holds characters a header cannot carry",
        )
    })
}

fn missing_token() -> ToolFailure {
    ToolFailure::bridge(
        "UNAUTHENTICATED",
        Reason::TokenMissing,
        "no session token: this shared endpoint acts as the session whose token comes in \
         `Authorization: Bearer <token>` on each request, and this request has none",
    )
    .with_advice(
        "Configure the MCP client to send the header with the session's TROUPE_SESSION_TOKEN.",
    )
}

fn malformed_authorization() -> ToolFailure {
    ToolFailure::bridge(
        "UNAUTHENTICATED",
        Reason::TokenInvalid,
        "the Authorization header must be `Bearer <session token>`",
    )
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn jwt(sub: &str) -> String {
        let encode = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        format!(
            "{}.{}.sig",
            encode(r#"{"alg":"HS256","kid":"k"}"#),
            encode(&format!(r#"{{"sub":"{sub}","exp":1}}"#))
        )
    }

    fn headers(auth: Option<&str>, hint: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(auth) = auth {
            headers.insert("authorization", HeaderValue::from_str(auth).unwrap());
        }
        if let Some(hint) = hint {
            headers.insert(SESSION_HINT_HEADER, HeaderValue::from_str(hint).unwrap());
        }
        headers
    }

    #[test]
    fn the_callers_trace_context_is_forwarded() {
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let none = Extensions::new();
        let stdio = Identity::fixed("t", Some(traceparent)).unwrap();
        assert_eq!(
            stdio.traceparent(&none).unwrap().to_str().unwrap(),
            traceparent
        );
        assert!(
            Identity::fixed("t", None)
                .unwrap()
                .traceparent(&none)
                .is_none()
        );
        assert!(
            Identity::fixed("t", Some("not\nheader"))
                .unwrap()
                .traceparent(&none)
                .is_none()
        );

        let (mut parts, ()) = axum::http::Request::builder()
            .header(TRACEPARENT_HEADER, traceparent)
            .body(())
            .unwrap()
            .into_parts();
        parts
            .headers
            .insert("authorization", HeaderValue::from_static("Bearer t"));
        let mut http = Extensions::new();
        http.insert(parts);
        assert_eq!(
            Identity::PerRequest
                .traceparent(&http)
                .unwrap()
                .to_str()
                .unwrap(),
            traceparent
        );
        assert!(Identity::PerRequest.traceparent(&none).is_none());
    }

    #[test]
    fn subject_is_read_from_the_payload() {
        assert_eq!(
            unverified_subject(&jwt("sess_a")).as_deref(),
            Some("sess_a")
        );
        assert_eq!(unverified_subject("troupe-op-0123"), None);
        assert_eq!(unverified_subject("a.!!!.c"), None);
    }

    #[test]
    fn bearer_and_hint() {
        let token = jwt("sess_a");
        let auth = format!("Bearer {token}");
        let value = from_headers(&headers(Some(&auth), None)).unwrap();
        assert_eq!(value.to_str().unwrap(), auth);
        assert!(from_headers(&headers(Some(&auth), Some("sess_a"))).is_ok());
        assert!(from_headers(&headers(Some(&format!("bearer  {token}")), None)).is_ok());

        let mismatch = from_headers(&headers(Some(&auth), Some("sess_b"))).unwrap_err();
        assert_eq!(mismatch.reason, Some(Reason::SessionHintMismatch));
        assert!(mismatch.message.contains("sess_b"), "{}", mismatch.message);

        let missing = from_headers(&headers(None, Some("sess_a"))).unwrap_err();
        assert_eq!(missing.reason, Some(Reason::TokenMissing));
        let basic = from_headers(&headers(Some("Basic abc"), None)).unwrap_err();
        assert_eq!(basic.reason, Some(Reason::TokenInvalid));
        let opaque = from_headers(&headers(Some("Bearer opaque"), Some("sess_a"))).unwrap_err();
        assert_eq!(opaque.reason, Some(Reason::SessionHintMismatch));
        // An empty hint is no hint.
        assert!(from_headers(&headers(Some("Bearer opaque"), Some(""))).is_ok());
    }

    #[test]
    fn a_token_is_a_jwt_of_three_segments_or_has_no_subject() {
        let token = jwt("sess_a");
        assert_eq!(unverified_subject(&format!("{token}.more")), None);
        let no_sub = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(r#"{"exp":1}"#);
        assert_eq!(unverified_subject(&format!("h.{no_sub}.s")), None);
    }

    #[test]
    fn a_call_with_no_http_request_has_no_token() {
        let missing = Identity::PerRequest
            .authorization(&Extensions::new())
            .unwrap_err();
        assert_eq!(missing.reason, Some(Reason::TokenMissing));
        assert!(
            missing
                .advice
                .is_some_and(|a| a.contains("TROUPE_SESSION_TOKEN"))
        );
    }
}
