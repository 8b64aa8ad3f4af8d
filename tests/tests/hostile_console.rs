//! Hostile clients of the web console, over plain HTTP with a raw client,
//! on either backend: a page that reaches the console by a name of its own
//! (DNS rebinding) gets nothing, a change posted from another origin is
//! refused, and a flood of wrong sign-ins from many addresses neither
//! writes an audit entry each nor keeps the operator out.

use hyper::{Method, StatusCode};
use serde_json::json;
use troupe_proto::session::ListAuditRequest;
use troupe_tests::{
    OPERATOR_TOKEN, TestServer,
    console::{self, JSON, LIMIT},
    http,
};

/// Sends `method path` to the console at `addr` with `headers` (a `host`
/// among them replaces the one the URL gives).
async fn call(
    addr: std::net::SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> http::Answer {
    http::send(
        method,
        &format!("http://{addr}{path}"),
        headers,
        body,
        LIMIT,
    )
    .await
}

fn sign_in_body() -> String {
    json!({ "token": OPERATOR_TOKEN }).to_string()
}

async fn audit(server: &TestServer) -> Vec<troupe_proto::session::AuditEntry> {
    server
        .operator()
        .await
        .list_audit(ListAuditRequest {
            session_id: String::new(),
            after_id: 0,
            limit: 100_000,
        })
        .await
        .expect("audit")
        .into_inner()
        .entries
}

/// A refusal of `Host` or `Origin`: 403, no cookie, and a body that names
/// nothing of the request or the service.
fn assert_refused(answer: &http::Answer, what: &str) {
    assert_eq!(
        answer.status,
        StatusCode::FORBIDDEN,
        "{what}: {}",
        answer.body
    );
    assert!(
        answer.headers.get("set-cookie").is_none(),
        "{what}: a cookie"
    );
    for secret in [OPERATOR_TOKEN, "csrf", "attacker", "sess_", "workspace"] {
        assert!(
            !answer.body.contains(secret),
            "{what}: {secret} in {}",
            answer.body
        );
    }
    assert_eq!(
        answer.json()["code"],
        "PERMISSION_DENIED",
        "{what}: {}",
        answer.body
    );
}

#[tokio::test]
async fn the_console_answers_only_to_loopback_names_and_the_allowed_ones() {
    let (server, addr) =
        console::server(|c| c.console.console_allowed_hosts = vec!["console.example".into()]).await;
    let port = addr.port();
    let rebound = [
        "attacker.example".to_owned(),
        format!("attacker.example:{port}"),
        format!("localhost.attacker.example:{port}"),
        format!("127.0.0.1.nip.io:{port}"),
        format!("127.0.0.2:{port}"),
        format!("console.example.attacker.example:{port}"),
        "user@localhost".to_owned(),
        String::new(),
    ];
    for host in &rebound {
        let headers = [("host", host.as_str())];
        for path in [
            "/",
            "/app.js",
            "/api/session",
            "/api/workspaces",
            "/nowhere",
        ] {
            let answer = call(addr, Method::GET, path, &headers, "").await;
            assert_refused(&answer, &format!("GET {path} as {host:?}"));
            assert!(
                answer.headers.get("content-security-policy").is_some(),
                "the refusal carries the headers of every answer"
            );
        }
        // The right token through a rebound name signs no one in.
        let answer = call(
            addr,
            Method::POST,
            "/api/sign-in",
            &[JSON, ("host", host.as_str())],
            &sign_in_body(),
        )
        .await;
        assert_refused(&answer, &format!("sign-in as {host:?}"));
    }
    let signed_in = audit(&server)
        .await
        .into_iter()
        .filter(|e| e.action == "console_sign_in")
        .count();
    assert_eq!(signed_in, 0, "no sign-in was even looked at");

    // The loopback names with any port, and the added name, are served.
    for host in [
        format!("localhost:{port}"),
        format!("LocalHost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        "localhost".to_owned(),
        "console.example".to_owned(),
        format!("console.example:{port}"),
    ] {
        let page = call(addr, Method::GET, "/", &[("host", host.as_str())], "").await;
        assert_eq!(page.status, StatusCode::OK, "{host}: {}", page.body);
        let signed = call(
            addr,
            Method::POST,
            "/api/sign-in",
            &[JSON, ("host", host.as_str())],
            &sign_in_body(),
        )
        .await;
        assert_eq!(signed.status, StatusCode::OK, "{host}: {}", signed.body);
    }
}

#[tokio::test]
async fn an_allowed_host_that_is_not_a_host_stops_the_start() {
    for bad in ["http://console.example", "console.example/x", "a@b"] {
        let dir = tempfile::tempdir().expect("a directory");
        let mut config = troupe_session_svc::Config::with_data_dir(dir.path());
        config.console.console_listen = Some(console::free_addr());
        config.console.console_allowed_hosts = vec![bad.to_owned()];
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let served = tokio::time::timeout(
            LIMIT,
            troupe_session_svc::serve(config, listener, std::future::pending()),
        )
        .await
        .expect("refused at once");
        let err = served.expect_err(bad).to_string();
        assert!(err.contains("--console-allowed-host"), "{err}");
    }
}

#[tokio::test]
async fn a_change_from_another_origin_is_refused() {
    let (server, addr) = console::server(|_| {}).await;
    let port = addr.port();
    let own = format!("http://{addr}");
    let foreign = [
        "http://attacker.example".to_owned(),
        format!("http://attacker.example:{port}"),
        format!("http://localhost:{}", port.wrapping_add(1).max(1)),
        format!("http://127.0.0.1:{}", port.wrapping_add(1).max(1)),
        format!("http://localhost:{port}"),
        "null".to_owned(),
        format!("file://{addr}"),
    ];
    // The sign-in: from another origin (even another loopback port, or
    // the other loopback name: not the origin the request was sent to),
    // not even with the right token.
    for origin in &foreign {
        let answer = call(
            addr,
            Method::POST,
            "/api/sign-in",
            &[JSON, ("origin", origin.as_str())],
            &sign_in_body(),
        )
        .await;
        assert_refused(&answer, &format!("sign-in from {origin}"));
    }
    let twice = call(
        addr,
        Method::POST,
        "/api/sign-in",
        &[
            JSON,
            ("origin", own.as_str()),
            ("origin", "http://attacker.example"),
        ],
        &sign_in_body(),
    )
    .await;
    assert_refused(&twice, "two origins");
    let from_own = call(
        addr,
        Method::POST,
        "/api/sign-in",
        &[JSON, ("origin", own.as_str())],
        &sign_in_body(),
    )
    .await;
    assert_eq!(from_own.status, StatusCode::OK, "{}", from_own.body);

    // An action with the cookie and the CSRF token, from another origin:
    // refused, and nothing is done.
    let (root, _, _) = server
        .root("alpha", troupe_proto::session::TrustLevel::Sandboxed)
        .await;
    let signed = console::sign_in(&own).await;
    let path = format!("/api/sessions/{}/messages", root.session_id);
    let acting = |origin: &'static str| {
        let (cookie, csrf) = (signed.cookie.clone(), signed.csrf.clone());
        let path = path.clone();
        async move {
            let mut headers = vec![
                JSON,
                ("cookie", cookie.as_str()),
                ("x-troupe-csrf", csrf.as_str()),
            ];
            if !origin.is_empty() {
                headers.push(("origin", origin));
            }
            call(addr, Method::POST, &path, &headers, r#"{"message":"hi"}"#).await
        }
    };
    for origin in ["http://attacker.example", "null"] {
        assert_refused(&acting(origin).await, &format!("a message from {origin}"));
    }
    assert_eq!(
        server.get(&root.session_id).await.inbox_count,
        1,
        "only the initial message"
    );
    // Without an Origin (a client that is not a browser), it is served.
    let served = acting("").await;
    assert_eq!(served.status, StatusCode::OK, "{}", served.body);
    assert_eq!(server.get(&root.session_id).await.inbox_count, 2);
    // Reads change nothing: another origin's GET is answered (a browser
    // keeps the answer from that origin's page).
    let read = call(
        addr,
        Method::GET,
        "/api/session",
        &[
            ("cookie", signed.cookie.as_str()),
            ("origin", "http://attacker.example"),
        ],
        "",
    )
    .await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
}
