//! Hostile clients of the web console, over plain HTTP with a raw client,
//! on either backend: a page that reaches the console by a name of its own
//! (DNS rebinding) gets nothing, a change posted from another origin is
//! refused, and a flood of wrong sign-ins from many addresses neither
//! writes an audit entry each nor keeps the operator out.

use hyper::{Method, StatusCode};
use serde_json::json;
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

/// Signs in to the console at `addr` with the right token, sent with the
/// header `header`.
async fn sign_in(addr: std::net::SocketAddr, header: (&str, &str)) -> http::Answer {
    call(
        addr,
        Method::POST,
        "/api/sign-in",
        &[JSON, header],
        &sign_in_body(),
    )
    .await
}

fn sign_in_body() -> String {
    json!({ "token": OPERATOR_TOKEN }).to_string()
}

async fn audit(server: &TestServer) -> Vec<troupe_proto::session::AuditEntry> {
    troupe_tests::audit_log(server, 100_000).await
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
        let answer = sign_in(addr, ("host", host.as_str())).await;
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
        let signed = sign_in(addr, ("host", host.as_str())).await;
        assert_eq!(signed.status, StatusCode::OK, "{host}: {}", signed.body);
    }
}

#[tokio::test]
async fn an_allowed_host_that_is_not_a_host_stops_the_start() {
    for bad in ["http://console.example", "console.example/x", "a@b"] {
        let dir = tempfile::tempdir().expect("a directory");
        let mut config = troupe_session_svc::Config::with_data_dir(dir.path());
        config.console.console_listen = Some(troupe_tests::ports::free_addr());
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
async fn a_request_from_another_origin_is_refused() {
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
        let answer = sign_in(addr, ("origin", origin.as_str())).await;
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
    let from_own = sign_in(addr, ("origin", own.as_str())).await;
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
    // A read across origins (a page of another port of this host would
    // send the cookie with it) is refused too; the same read without an
    // Origin, as the console's own page makes it, is served.
    for path in ["/api/session", "/api/events", "/api/workspaces"] {
        let headers = [
            ("cookie", signed.cookie.as_str()),
            ("origin", foreign[3].as_str()),
        ];
        let answer = call(addr, Method::GET, path, &headers, "").await;
        assert_refused(&answer, &format!("GET {path} from {}", foreign[3]));
    }
    let read = call(
        addr,
        Method::GET,
        "/api/session",
        &[("cookie", signed.cookie.as_str())],
        "",
    )
    .await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
}

/// A sign-in with `token` from the loopback address `from` (each of
/// 127.0.0.0/8 stands for another client).
async fn sign_in_from(
    addr: std::net::SocketAddr,
    from: std::net::IpAddr,
    token: &str,
) -> StatusCode {
    http::send_from(
        Some(from),
        Method::POST,
        &format!("http://{addr}/api/sign-in"),
        &[JSON],
        &json!({ "token": token }).to_string(),
        LIMIT,
    )
    .await
    .status
}

/// Wrong sign-ins a flood's task makes at most.
const FLOOD_ATTEMPTS: u32 = 3_000;
/// The flood's tasks, each from addresses of its own.
const FLOOD_TASKS: u8 = 6;
/// Failed sign-ins a minute, all clients together, in the flood test.
const GLOBAL_PER_MINUTE: u32 = 20;

#[tokio::test]
async fn a_flood_of_wrong_sign_ins_from_many_addresses_keeps_no_operator_out() {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, Ordering},
    };
    let (server, addr) = console::server(|c| {
        c.console.console_sign_in_global_failures_per_minute = GLOBAL_PER_MINUTE;
    })
    .await;
    let started = std::time::Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let throttled = Arc::new(AtomicU32::new(0));
    let mut flood = Vec::new();
    for task in 0..FLOOD_TASKS {
        let (stop, throttled) = (stop.clone(), throttled.clone());
        flood.push(tokio::spawn(async move {
            // Each attempt from an address not used before.
            for n in 0..FLOOD_ATTEMPTS {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let [_, _, hi, lo] = (n + 1).to_be_bytes();
                let from = std::net::IpAddr::from([127, 10 + task, hi, lo]);
                let status = sign_in_from(addr, from, "not-the-operator-token-000").await;
                match status {
                    StatusCode::UNAUTHORIZED => {}
                    StatusCode::TOO_MANY_REQUESTS => {
                        throttled.fetch_add(1, Ordering::Relaxed);
                    }
                    other => panic!("a wrong sign-in answered {other}"),
                }
            }
        }));
    }
    // The flood is past the global bound once a wrong token from a fresh
    // address waits.
    let deadline = std::time::Instant::now() + LIMIT;
    let mut fresh = 0u32;
    loop {
        fresh += 1;
        let [_, _, hi, lo] = fresh.to_be_bytes();
        let from = std::net::IpAddr::from([127, 9, hi, lo]);
        if sign_in_from(addr, from, "not-the-operator-token-001").await
            == StatusCode::TOO_MANY_REQUESTS
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the flood never reached the global bound"
        );
    }
    // Meanwhile, the operator signs in ten times, from the usual address.
    let mut signed_in = 0;
    for _ in 0..10 {
        let status = sign_in_from(addr, [127, 0, 0, 1].into(), OPERATOR_TOKEN).await;
        if status == StatusCode::OK {
            signed_in += 1;
        }
        assert!(
            !flood.iter().all(|t| t.is_finished()),
            "the flood ended before the operator's sign-ins"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for task in flood {
        task.await.expect("a flood task");
    }
    assert_eq!(
        signed_in, 10,
        "the operator's sign-ins that got through the flood"
    );
    assert!(
        throttled.load(Ordering::Relaxed) > 0,
        "the flood was throttled"
    );
    // Only failures within the global bound were audited, one each.
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    let bound = f64::from(GLOBAL_PER_MINUTE) * (1.0 + minutes) + 1.0;
    let audited = audit(&server)
        .await
        .into_iter()
        .filter(|e| e.action == "console_sign_in" && !e.allowed)
        .count();
    assert!(
        (audited as f64) <= bound && audited >= GLOBAL_PER_MINUTE as usize,
        "{audited} failed sign-ins audited, the bound is {bound:.1}"
    );
}
