//! Signing in and out: only the operator token, the cookie and the CSRF
//! token on every call, failed sign-ins throttled.

use super::*;

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
