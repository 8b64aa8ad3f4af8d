//! The web console's server side over plain HTTP, on either backend: the
//! operator token signs in (anything else is refused and audited), the
//! cookie and the CSRF token gate every call, actions go through the
//! service's own handlers (their audit entries, and the console's own),
//! sign-out ends the sign-in; and the store's contract of sign-ins (only
//! hashes kept, expiry) and of a session's messages, on both backends. The
//! page itself, in a real browser, is `runner-svc/tests/console.rs`.

use std::time::Duration;

use hyper::{Method, StatusCode};
use serde_json::json;
use troupe_proto::session::ListAuditRequest;
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
    server
        .operator()
        .await
        .list_audit(ListAuditRequest {
            session_id: String::new(),
            after_id: 0,
            limit: 10_000,
        })
        .await
        .unwrap()
        .into_inner()
        .entries
}

#[tokio::test]
async fn only_the_operator_token_signs_in_and_a_refusal_is_audited() {
    let (server, base) = console_server().await;
    let url = format!("{base}/api/sign-in");
    for (what, body) in [
        (
            "a wrong token",
            json!({ "token": "not-the-operator-token-000" }),
        ),
        ("a prefix of it", json!({ "token": &OPERATOR_TOKEN[..20] })),
        (
            "the token and more",
            json!({ "token": format!("{OPERATOR_TOKEN}x") }),
        ),
        ("an empty one", json!({ "token": "" })),
    ] {
        let answer = http::send(Method::POST, &url, &[JSON], &body.to_string(), LIMIT).await;
        assert_eq!(
            answer.status,
            StatusCode::UNAUTHORIZED,
            "{what}: {}",
            answer.body
        );
        assert!(
            answer.headers.get("set-cookie").is_none(),
            "{what}: a cookie"
        );
    }
    // Not JSON: refused before the token is looked at (no cross-site form can post it).
    let form = http::send(
        Method::POST,
        &url,
        &[("content-type", "application/x-www-form-urlencoded")],
        &format!("token={OPERATOR_TOKEN}"),
        LIMIT,
    )
    .await;
    assert_eq!(form.status, StatusCode::FORBIDDEN, "{}", form.body);
    let refusals = audit(&server)
        .await
        .into_iter()
        .filter(|e| e.action == "console_sign_in" && !e.allowed)
        .count();
    assert_eq!(refusals, 4, "each refused sign-in is audited");
    let audit_text = format!("{:?}", audit(&server).await);
    assert!(
        !audit_text.contains("not-the-operator"),
        "no presented token in the audit"
    );
}

#[tokio::test]
async fn the_cookie_and_the_csrf_token_gate_every_call_and_sign_out_ends_them() {
    let (server, base) = console_server().await;
    let api = |path: &str| format!("{base}{path}");
    let unsigned = http::send(Method::GET, &api("/api/workspaces"), &[], "", LIMIT).await;
    assert_eq!(unsigned.status, StatusCode::UNAUTHORIZED);
    let forged_cookie = http::send(
        Method::GET,
        &api("/api/workspaces"),
        &[(
            "cookie",
            "troupe_console=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        )],
        "",
        LIMIT,
    )
    .await;
    assert_eq!(forged_cookie.status, StatusCode::UNAUTHORIZED);

    let (cookie, csrf) = sign_in(&base).await;
    let cookie = ("cookie", cookie.as_str());
    let session = http::send(Method::GET, &api("/api/session"), &[cookie], "", LIMIT).await;
    assert_eq!(session.status, StatusCode::OK);
    assert_eq!(session.json()["csrf_token"], csrf.as_str());
    assert_eq!(session.headers["cache-control"], "no-store");

    // A create without the CSRF token, or with another, is refused and
    // creates nothing; with it, the service's own refusal comes back
    // (no such agent), worded as over gRPC.
    let create = json!({"workspace_id": "alpha", "agent_name": "nobody"}).to_string();
    for headers in [
        vec![JSON, cookie],
        vec![JSON, cookie, ("x-troupe-csrf", "0")],
    ] {
        let answer = http::send(
            Method::POST,
            &api("/api/sessions"),
            &headers,
            &create,
            LIMIT,
        )
        .await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.body);
    }
    let csrf_header = ("x-troupe-csrf", csrf.as_str());
    let answer = http::send(
        Method::POST,
        &api("/api/sessions"),
        &[JSON, cookie, csrf_header],
        &create,
        LIMIT,
    )
    .await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND, "{}", answer.body);
    assert_eq!(answer.json()["reason"], "AGENT_NOT_FOUND");
    // Bad input is INVALID_ARGUMENT with a clear message.
    let bad = http::send(
        Method::POST,
        &api("/api/sessions"),
        &[JSON, cookie, csrf_header],
        r#"{"workspace_id": "alpha", "agent_name": "x", "trust_level": "root"}"#,
        LIMIT,
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    assert!(
        bad.json()["message"]
            .as_str()
            .unwrap()
            .contains("trust_level")
    );

    // The service's handler audited the create, and the console its own entry.
    let entries = audit(&server).await;
    assert!(
        entries
            .iter()
            .any(|e| e.action == "create_root_session" && e.caller == "operator" && !e.allowed)
    );
    assert!(
        entries
            .iter()
            .any(|e| e.action == "console_create_root_session"
                && e.detail.contains("through the web console"))
    );

    let out = http::send(
        Method::POST,
        &api("/api/sign-out"),
        &[JSON, cookie, csrf_header],
        "{}",
        LIMIT,
    )
    .await;
    assert_eq!(out.status, StatusCode::OK, "{}", out.body);
    assert!(
        out.headers["set-cookie"]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
    let after = http::send(Method::GET, &api("/api/session"), &[cookie], "", LIMIT).await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED, "the sign-in ended");
}

#[tokio::test]
async fn the_agents_a_workspace_could_run_are_offered_from_the_database_and_files() {
    let (server, base) = console_server().await;
    server.write_agent(Some("alpha"), "reviewer");
    server.write_agent(None, "helper");
    let (cookie, _) = sign_in(&base).await;
    let answer = http::send(
        Method::GET,
        &format!("{base}/api/agents?workspace=alpha"),
        &[("cookie", cookie.as_str())],
        "",
        LIMIT,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let names: Vec<(String, String)> = answer.json()["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["workspace_id"].as_str().unwrap().to_owned(),
                a["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        names.contains(&("alpha".into(), "reviewer".into())),
        "{names:?}"
    );
    assert!(
        names.contains(&(String::new(), "helper".into())),
        "{names:?}"
    );
}

#[tokio::test]
async fn a_trace_url_that_is_not_an_http_link_with_the_trace_id_stops_the_start() {
    for url in [
        "javascript:alert(1)//{trace_id}",
        "http://jaeger:16686/trace/",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = troupe_session_svc::Config::with_data_dir(dir.path());
        config.console.console_listen = Some(free_addr());
        config.console.console_trace_url = Some(url.to_owned());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let served = tokio::time::timeout(
            LIMIT,
            troupe_session_svc::serve(config, listener, std::future::pending()),
        )
        .await
        .expect("refused at once");
        let err = served.expect_err(url).to_string();
        assert!(err.contains("--console-trace-url"), "{err}");
    }
}

/// A sign-in from the loopback address `from` (one of 127.0.0.0/8: each
/// stands for another client); its answer.
async fn sign_in_from(base: &str, from: &str, token: &str) -> http::Answer {
    http::send_from(
        Some(from.parse().unwrap()),
        Method::POST,
        &format!("{base}/api/sign-in"),
        &[JSON],
        &json!({ "token": token }).to_string(),
        LIMIT,
    )
    .await
}

#[tokio::test]
async fn failed_sign_ins_are_throttled_per_client_and_in_all() {
    // The defaults per client (5 a minute), and 8 a minute in all.
    let (server, addr) = troupe_tests::console::server(|c| {
        c.console.console_sign_in_global_failures_per_minute = 8;
    })
    .await;
    let base = format!("http://{addr}");
    let wrong = "not-the-operator-token-000";
    for n in 0..5 {
        let answer = sign_in_from(&base, "127.0.0.2", wrong).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "failure {n}");
    }
    // The sixth waits, the right token too: it is not even looked at.
    for token in [wrong, OPERATOR_TOKEN] {
        let answer = sign_in_from(&base, "127.0.0.2", token).await;
        assert_eq!(
            answer.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{}",
            answer.body
        );
        let retry: u64 = answer.headers["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=12).contains(&retry), "Retry-After: {retry}");
        assert!(answer.headers.get("set-cookie").is_none());
    }
    // Another client signs in meanwhile; a right token costs nothing.
    for _ in 0..6 {
        let answer = sign_in_from(&base, "127.0.0.3", OPERATOR_TOKEN).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    }
    // Failures from many clients reach the global bound: then a wrong
    // token waits, unaudited; the right one still signs in.
    for n in 0..3 {
        let answer = sign_in_from(&base, "127.0.0.4", wrong).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "failure {n}");
    }
    let flood = sign_in_from(&base, "127.0.0.5", wrong).await;
    assert_eq!(
        flood.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        flood.body
    );
    assert!(flood.headers.get("retry-after").is_some());
    let operator = sign_in_from(&base, "127.0.0.5", OPERATOR_TOKEN).await;
    assert_eq!(operator.status, StatusCode::OK, "{}", operator.body);
    // Only the failures within both bounds are audited.
    let refusals = audit(&server)
        .await
        .into_iter()
        .filter(|e| e.action == "console_sign_in" && !e.allowed)
        .count();
    assert_eq!(refusals, 8);
}

#[tokio::test]
async fn a_tree_snapshot_carries_inbox_progress_and_refused_spawns() {
    use troupe_proto::session::{ReportProgressRequest, SendMessageRequest, TrustLevel};
    let (server, base) = console_server().await;
    let (root, mut agent, _) = server.root("alpha", TrustLevel::Sandboxed).await;
    let id = root.session_id.clone();
    let mut operator = server.operator().await;
    for n in 0..2 {
        operator
            .send_message(SendMessageRequest {
                session_id: id.clone(),
                message: format!("message {n}"),
                request_id: String::new(),
            })
            .await
            .unwrap();
    }
    agent
        .report_progress(ReportProgressRequest {
            progress: 40,
            description: "half way".to_owned(),
        })
        .await
        .unwrap();
    let refused = troupe_proto::session::CreateSessionRequest {
        agent_name: "nobody".to_owned(),
        ..troupe_tests::child("refused")
    };
    agent
        .create_session(refused)
        .await
        .expect_err("no such agent");

    let (cookie, _) = sign_in(&base).await;
    let cookie = ("cookie", cookie.as_str());
    let snapshot = http::send(
        Method::GET,
        &format!("{base}/api/workspaces/alpha/sessions"),
        &[cookie],
        "",
        LIMIT,
    )
    .await;
    assert_eq!(snapshot.status, StatusCode::OK, "{}", snapshot.body);
    let snapshot = snapshot.json();
    let node = snapshot["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["session_id"] == id.as_str())
        .expect("the root")
        .clone();
    // No runner here: the initial message and the two stay unread.
    assert_eq!(
        node["inbox"],
        json!({"received": 3, "delivered_through": 0, "unread": 3})
    );
    assert_eq!(
        node["progress"],
        json!({"progress": 40, "description": "half way"})
    );
    assert!(snapshot["cursor"].as_u64().unwrap() > 0);
    let refusals = snapshot["refused"].as_array().unwrap();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert_eq!(refusals[0]["target"], id.as_str());
    // The page follows refusals from the cursor it was given: none new.
    let after = snapshot["audit_cursor"].as_u64().unwrap();
    let follow = http::send(
        Method::GET,
        &format!("{base}/api/refused?workspace=alpha&after={after}"),
        &[cookie],
        "",
        LIMIT,
    )
    .await;
    assert_eq!(follow.status, StatusCode::OK, "{}", follow.body);
    assert_eq!(follow.json()["refused"], json!([]));
    let unnamed = http::send(
        Method::GET,
        &format!("{base}/api/refused?after={after}"),
        &[cookie],
        "",
        LIMIT,
    )
    .await;
    assert_eq!(unnamed.status, StatusCode::BAD_REQUEST, "{}", unnamed.body);
    assert_eq!(unnamed.json()["code"], "INVALID_ARGUMENT");
    let view = http::send(
        Method::GET,
        &format!("{base}/api/sessions/{id}"),
        &[cookie],
        "",
        LIMIT,
    )
    .await;
    assert_eq!(view.json()["unread_count"], 3);
}

/// Sign-ins as the store keeps them, on either backend: the hash of the
/// id, never the id; none after its expiry; none after sign-out.
async fn sign_in_contract(store: impl Store) {
    let id = ConsoleSessionId::generate();
    let now = now_ms();
    let live = ConsoleSession {
        id_hash: id.hash(),
        csrf: CsrfToken::generate(),
        created_at_ms: now,
        expires_at_ms: now + 60_000,
    };
    store.create_console_session(&live).await.unwrap();
    let found = store
        .console_session(&id.hash(), now)
        .await
        .unwrap()
        .expect("found");
    assert!(found.csrf == live.csrf);
    assert!(
        store
            .console_session(id.expose(), now)
            .await
            .unwrap()
            .is_none(),
        "keyed by the hash alone"
    );
    assert!(
        store
            .console_session(&id.hash(), now + 60_001)
            .await
            .unwrap()
            .is_none(),
        "expired"
    );
    assert!(store.delete_console_session(&id.hash()).await.unwrap());
    assert!(
        store
            .console_session(&id.hash(), now)
            .await
            .unwrap()
            .is_none(),
        "signed out"
    );
    assert!(!store.delete_console_session(&id.hash()).await.unwrap());
}

/// A session's messages, in and out, bodies included, oldest first.
async fn messages_contract(store: impl Store) {
    for id in ["sess_a", "sess_b"] {
        store
            .create_root(
                new_session(id, Trust::Sandboxed),
                None,
                operator_audit(Action::CreateRootSession, id),
                &|_| Ok(QuotaLeft::default()),
            )
            .await
            .unwrap();
    }
    // Ids in the order of sending, as the service's (UUID v7) are.
    let send = |n: u32, to: &'static str, from: Principal, body: &'static str| {
        let store = store.clone();
        async move {
            store
                .send_message(
                    to,
                    NewMessage {
                        message_id: format!("msg_{n}"),
                        sender: from,
                        body: body.to_owned(),
                    },
                    None,
                    operator_audit(Action::SendMessage, to),
                    troupe_tests::stores::UNBOUNDED,
                    &|_| Ok(()),
                )
                .await
                .unwrap()
        }
    };
    send(1, "sess_a", Principal::Operator, "to a").await;
    send(2, "sess_b", Principal::Session("sess_a".into()), "from a").await;
    send(3, "sess_b", Principal::Operator, "not a's").await;
    let got = store.session_messages("sess_a", 10).await.unwrap();
    let bodies: Vec<_> = got
        .iter()
        .map(|m| (m.session_id.as_str(), m.body.as_str()))
        .collect();
    assert_eq!(bodies, [("sess_a", "to a"), ("sess_b", "from a")]);
    assert_eq!(
        store.session_messages("sess_a", 1).await.unwrap()[0].body,
        "from a",
        "the newest"
    );
}

#[tokio::test]
async fn sign_ins_and_messages_in_the_store_on_sqlite() {
    let (_dir, store) = troupe_tests::stores::sqlite().await;
    sign_in_contract(store.clone()).await;
    messages_contract(store).await;
}

#[tokio::test]
async fn sign_ins_and_messages_in_the_store_on_postgres() {
    let store = troupe_tests::stores::postgres().await;
    sign_in_contract(store.clone()).await;
    messages_contract(store).await;
}
