//! Signing in and out, and who a console request is from.
//!
//! The operator token is posted once, in a JSON body (never a URL), checked
//! in constant time against the token the service already uses, and
//! exchanged for a console session: a random id in an HttpOnly,
//! SameSite=Strict cookie (only its hash is stored, in the database, so any
//! replica answers for it) and a CSRF token, which the page gets in a JSON
//! answer and sends back in the [`CSRF_HEADER`] of every state-changing
//! request. Every POST must also be `application/json`, which no
//! cross-site form can send.
//!
//! `Console::signed` finds the cookie's live sign-in (else 401);
//! `Console::acting` also requires JSON and the CSRF header (else 403).

use std::{net::SocketAddr, sync::Arc};

use axum::{
    Extension, Json,
    extract::{ConnectInfo, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::Deserialize;

use super::{Console, calls::ApiError, no_store, throttle::Failure};
use troupe_domain::error::Reason;
use troupe_domain::model::{
    Action, AuditRecord, ConsoleSession, ConsoleSessionId, CsrfToken, OperatorToken, Principal,
    now_ms,
};
use troupe_store::Store;

/// The console's cookie.
pub const COOKIE: &str = "troupe_console";
/// The header every state-changing request carries its CSRF token in.
pub const CSRF_HEADER: &str = "x-troupe-csrf";

#[derive(Deserialize)]
pub struct SignIn {
    token: String,
}

/// A request's console session, once its cookie named a live one.
pub struct Signed {
    pub session: ConsoleSession,
}

impl Signed {
    /// A short, non-secret name of this sign-in for audit entries.
    pub fn label(&self) -> String {
        format!("console sign-in {}", &self.session.id_hash[..12])
    }
}

/// `POST /api/sign-in {"token"}`: a console session for the operator token.
/// Failed sign-ins are bounded ([`super::throttle`]): past the client's
/// bound, 429 with `Retry-After` before the token is compared; past the
/// global bound, a wrong token is answered 429 without an audit entry, a
/// right one still signs in.
pub async fn sign_in<S: Store>(
    State(console): State<Arc<Console<S>>>,
    connected: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: Result<Json<SignIn>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    require_json(&headers)?;
    let Json(body) = body.map_err(|e| ApiError::invalid(format!("bad sign-in body: {e}")))?;
    // Served without the peers' addresses (a router mounted elsewhere),
    // every client counts as one: the bound still holds.
    let client = connected.map_or(SocketAddr::from(([0, 0, 0, 0], 0)), |c| c.0.0);
    let admitted = console
        .sign_ins
        .admit(client.ip())
        .map_err(|wait| throttled(&console, wait))?;
    let presented = OperatorToken::new(&body.token);
    let expected = OperatorToken::new(console.inner.tokens.operator());
    if presented.is_none() || presented != expected {
        if let Failure::Flood(wait) = console.sign_ins.failed(admitted) {
            return Err(throttled(&console, wait));
        }
        console
            .audit(AuditRecord {
                caller: Principal::Anonymous,
                action: troupe_domain::model::Action::ConsoleSignIn,
                target: String::new(),
                allowed: false,
                reason: Reason::TokenInvalid.as_str().to_owned(),
                detail: "not the operator token".to_owned(),
            })
            .await;
        return Err(ApiError::unauthenticated("not the operator token"));
    }
    console.sign_ins.succeeded(admitted);
    let id = ConsoleSessionId::generate();
    let created_at_ms = now_ms();
    let ttl_ms = i64::try_from(console.settings.ttl.as_millis()).unwrap_or(i64::MAX);
    let session = ConsoleSession {
        id_hash: id.hash(),
        csrf: CsrfToken::generate(),
        created_at_ms,
        expires_at_ms: created_at_ms.saturating_add(ttl_ms),
    };
    console.inner.store.create_console_session(&session).await?;
    let signed = Signed { session };
    console
        .audit_console(&signed, Action::ConsoleSignIn, "", Ok(()))
        .await;
    let cookie = cookie_header(
        id.expose(),
        console.settings.ttl.as_secs(),
        console.settings.secure_cookie,
    );
    let mut response = no_store(Json(session_json(&console, &signed.session)).into_response());
    response.headers_mut().insert(header::SET_COOKIE, cookie);
    Ok(response)
}

/// A sign-in refused by the throttle: 429, and when to try again (whole
/// seconds, rounded up). Not audited, and logged as a count at most every
/// few seconds, so a flood writes next to nothing.
fn throttled<S: Store>(console: &Console<S>, wait: std::time::Duration) -> ApiError {
    if let Some(refused) = console.sign_ins.refused() {
        tracing::warn!(refused, "console sign-ins throttled");
    }
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "RESOURCE_EXHAUSTED",
        format!("too many failed sign-ins; try again in {secs} s"),
    )
    .retry_after(secs.max(1))
}

/// `GET /api/session`: the page's CSRF token and settings, for a signed-in browser.
pub async fn session<S: Store>(
    State(console): State<Arc<Console<S>>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let signed = console.signed(&headers).await?;
    Ok(no_store(
        Json(session_json(&console, &signed.session)).into_response(),
    ))
}

/// `POST /api/sign-out`: ends the console session, clears the cookie.
pub async fn sign_out<S: Store>(
    State(console): State<Arc<Console<S>>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let signed = console.acting(&headers).await?;
    console
        .inner
        .store
        .delete_console_session(&signed.session.id_hash)
        .await?;
    console
        .audit_console(&signed, Action::ConsoleSignOut, "", Ok(()))
        .await;
    let mut response = no_store(Json(serde_json::json!({"signed_out": true})).into_response());
    response.headers_mut().insert(
        header::SET_COOKIE,
        cookie_header("", 0, console.settings.secure_cookie),
    );
    Ok(response)
}

fn session_json<S: Store>(console: &Console<S>, session: &ConsoleSession) -> serde_json::Value {
    serde_json::json!({
        "csrf_token": session.csrf.expose(),
        "expires_at_ms": session.expires_at_ms,
        "trace_links": console.settings.trace_url.is_some(),
    })
}

impl<S: Store> Console<S> {
    /// The console session the request's cookie names, if it is live:
    /// UNAUTHENTICATED (401) otherwise.
    pub async fn signed(&self, headers: &HeaderMap) -> Result<Signed, ApiError> {
        let id = cookie_value(headers)
            .and_then(ConsoleSessionId::parse)
            .ok_or_else(|| ApiError::unauthenticated("sign in first"))?;
        let session = self
            .inner
            .store
            .console_session(&id.hash(), now_ms())
            .await?
            .ok_or_else(|| {
                ApiError::unauthenticated("the console sign-in has ended; sign in again")
            })?;
        Ok(Signed { session })
    }

    /// [`Console::signed`], for a request that changes something: it must
    /// be JSON and carry the sign-in's CSRF token (PERMISSION_DENIED, 403,
    /// otherwise).
    pub async fn acting(&self, headers: &HeaderMap) -> Result<Signed, ApiError> {
        let signed = self.signed(headers).await?;
        require_json(headers)?;
        let presented = headers
            .get(CSRF_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !signed.session.csrf.matches(presented) {
            return Err(ApiError::forbidden(
                "missing or wrong CSRF token; reload the console",
            ));
        }
        Ok(signed)
    }
}

/// Every POST is JSON: a cross-site HTML form cannot send it.
fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if json {
        Ok(())
    } else {
        Err(ApiError::forbidden(
            "state-changing requests must be application/json",
        ))
    }
}

/// The value of the console's cookie, from the request's `Cookie` headers.
fn cookie_value(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim())
}

fn cookie_header(value: &str, max_age_secs: u64, secure: bool) -> HeaderValue {
    let secure = if secure { "; Secure" } else { "" };
    let cookie = format!(
        "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age_secs}{secure}"
    );
    // The id is URL-safe base64: always a valid header value.
    HeaderValue::from_str(&cookie).unwrap_or_else(|_| HeaderValue::from_static(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_http_only_strict_and_secure_when_asked() {
        let plain = cookie_header("abc", 60, false);
        assert_eq!(
            plain.to_str().unwrap(),
            "troupe_console=abc; Path=/; HttpOnly; SameSite=Strict; Max-Age=60"
        );
        assert!(
            cookie_header("abc", 60, true)
                .to_str()
                .unwrap()
                .ends_with("; Secure")
        );
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; troupe_console=xyz"),
        );
        assert_eq!(cookie_value(&headers), Some("xyz"));
        let mut other = HeaderMap::new();
        other.append(
            header::COOKIE,
            HeaderValue::from_static("troupe_consoleX=1"),
        );
        assert_eq!(cookie_value(&other), None);
    }
}
