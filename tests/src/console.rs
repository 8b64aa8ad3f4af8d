//! The web console over plain HTTP, for its tests: a service with its
//! console on a loopback port, and a sign-in's cookie and CSRF token.

use std::{net::SocketAddr, time::Duration};

use hyper::{Method, StatusCode};
use troupe_session_svc::Config;

use crate::{OPERATOR_TOKEN, TestServer, http};

/// How long any console request may take in a test.
pub const LIMIT: Duration = Duration::from_secs(10);
/// The content type of every console POST.
pub const JSON: (&str, &str) = ("content-type", "application/json");

/// A free loopback port.
pub fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

/// A service with its console on a loopback port (and `adjust`ed); the
/// console's address.
pub async fn server(adjust: impl FnOnce(&mut Config)) -> (TestServer, SocketAddr) {
    let addr = free_addr();
    let server = TestServer::start_with(|c| {
        c.console.console_listen = Some(addr);
        adjust(c);
    })
    .await;
    http::wait_listening(addr).await;
    (server, addr)
}

/// A sign-in's `cookie` header value and CSRF token.
pub struct SignedIn {
    pub cookie: String,
    pub csrf: String,
}

/// Signs in at `base` (`http://ADDR`) with the operator token.
pub async fn sign_in(base: &str) -> SignedIn {
    let answer = http::send(
        Method::POST,
        &format!("{base}/api/sign-in"),
        &[JSON],
        &serde_json::json!({ "token": OPERATOR_TOKEN }).to_string(),
        LIMIT,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let cookie = answer.headers["set-cookie"].to_str().expect("ASCII cookie");
    let cookie = cookie.split(';').next().unwrap_or_default().to_owned();
    let csrf = answer.json()["csrf_token"]
        .as_str()
        .expect("a CSRF token")
        .to_owned();
    SignedIn { cookie, csrf }
}
