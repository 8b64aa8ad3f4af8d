//! The web console's server side over plain HTTP, on either backend: the
//! operator token signs in (anything else is refused and audited), the
//! cookie and the CSRF token gate every call, actions go through the
//! service's own handlers (their audit entries, and the console's own),
//! sign-out ends the sign-in; and the store's contract of sign-ins (only
//! hashes kept, expiry) and of a session's messages, on both backends. The
//! page itself, in a real browser, is `runner-svc/tests/console/`.

use std::time::Duration;

use hyper::{Method, StatusCode};
use serde_json::json;
use troupe_session_svc::{
    error::QuotaLeft,
    model::{
        Action, ConsoleSession, ConsoleSessionId, CsrfToken, NewMessage, Principal, Trust, now_ms,
    },
    store::Store,
};
use troupe_tests::{
    OPERATOR_TOKEN, TestServer, http,
    ports::free_addr,
    stores::{new_session, operator_audit},
};

const LIMIT: Duration = Duration::from_secs(10);
const JSON: (&str, &str) = ("content-type", "application/json");

/// A service with its console on a loopback port; its base URL.
async fn console_server() -> (TestServer, String) {
    let (server, addr) = troupe_tests::console::server(|_| {}).await;
    (server, format!("http://{addr}"))
}

/// Signs in; the `cookie` header's value and the CSRF token.
async fn sign_in(base: &str) -> (String, String) {
    let answer = http::send(
        Method::POST,
        &format!("{base}/api/sign-in"),
        &[JSON],
        &json!({ "token": OPERATOR_TOKEN }).to_string(),
        LIMIT,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let cookie = answer.headers["set-cookie"].to_str().unwrap();
    let cookie = cookie.split(';').next().unwrap().to_owned();
    let csrf = answer.json()["csrf_token"].as_str().unwrap().to_owned();
    (cookie, csrf)
}

async fn audit(server: &TestServer) -> Vec<troupe_proto::session::AuditEntry> {
    troupe_tests::audit_log(server, 10_000).await
}

mod pages;
mod sign_ins;
mod store;
