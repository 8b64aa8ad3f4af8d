//! The hostile suite of the model gateway: the bytes a client sends, on
//! the backend `TROUPE_TEST_BACKEND` names, by hand on TCP against the
//! real service: a body is not read before its token, nor past its bound;
//! one session's bodies in flight are bounded, and a body that stops
//! arriving is refused; a path the gateway does not serve is a `404`.

use std::time::Duration;

use serde_json::Value;
use troupe_tests::{gateway::*, http, upstream::Turn};

/// A body is never read before its token is checked: a `Content-Length`
/// of 60 MB with no token, or a bad one, is refused 401 without a byte of
/// it sent. With a live session's token, a declared body past the bound is
/// refused 413 before it is read, and a chunked one once it passes it.
#[tokio::test]
async fn a_body_is_not_read_before_its_token_nor_past_its_bound() {
    let setup = Setup::new(vec![]).await;
    let (_, token) = setup.root("alpha", None).await;
    let addr = setup.server.addr;
    let quick = Duration::from_secs(5);
    let sixty_mb = 60 << 20;
    for headers in [&[][..], &[("x-api-key", "not-a-token")][..]] {
        let answer = http::post_declared(addr, "/v1/messages", headers, sixty_mb, 0, quick).await;
        assert_eq!(answer.status, 401, "{answer:?}");
        assert!(answer.body.contains("authentication_error"), "{answer:?}");
    }
    let answer = http::post_declared(
        addr,
        "/v1/messages",
        &[("x-api-key", &token)],
        sixty_mb,
        0,
        quick,
    )
    .await;
    assert_eq!(answer.status, 413, "{answer:?}");
    let json: Value = serde_json::from_str(&answer.body).expect("JSON");
    assert_eq!(json["type"], "error", "{json}");
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("32 MiB"),
        "{json}"
    );

    let answer = http::post_chunked(
        addr,
        "/v1/chat/completions",
        &[("authorization", &format!("Bearer {token}"))],
        40 << 20,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(answer.status, 413, "{answer:?}");
    let json: Value = serde_json::from_str(&answer.body).expect("JSON");
    assert_eq!(json["error"]["code"], "request_too_large", "{json}");
    assert!(setup.upstream.requests().is_empty());
}

/// The bytes of one session's requests held at once are bounded (64 MiB):
/// with two bodies of 30 MiB sent but not ended, a third is refused `429`
/// as its bytes arrive, in the API's shape; another session's call is not;
/// once the two connections are gone, the session's calls pass again.
#[tokio::test]
async fn a_sessions_requests_in_flight_are_bounded() {
    use tokio::io::AsyncWriteExt;
    let setup = Setup::new(vec![Turn::text("other"), Turn::text("again")]).await;
    let (_, token) = setup.root("alpha", None).await;
    let (_, other) = setup.root("alpha", None).await;
    let addr = setup.server.addr;
    let (declared, sent) = (31 << 20, 30 << 20);
    let headers = [("x-api-key", token.as_str())];
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut stream = http::open_declared(addr, "/v1/messages", &headers, declared).await;
        stream.write_all(&vec![b' '; sent]).await.expect("30 MiB");
        open.push(stream);
    }
    // The two bodies' bytes are counted as the server reads them: a third
    // body read before them is not refused, and is dropped.
    let deadline = tokio::time::Instant::now() + LIMIT;
    let answer = loop {
        let mut third = http::open_declared(addr, "/v1/messages", &headers, declared).await;
        let _ = third.write_all(&vec![b' '; 8 << 20]).await;
        let quick = Duration::from_millis(500);
        match tokio::time::timeout(quick, http::read_answer(third, LIMIT)).await {
            Ok(answer) => break answer,
            Err(_) => assert!(tokio::time::Instant::now() < deadline, "never refused"),
        }
    };
    assert_eq!(answer.status, 429, "{answer:?}");
    let json: Value = serde_json::from_str(&answer.body).expect("JSON");
    assert_eq!(json["error"]["type"], "rate_limit_error", "{json}");
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("in flight"),
        "{json}"
    );
    assert_eq!(setup.call(&other, false).await.status, 200);
    drop(open);
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let answer = setup.call(&token, false).await;
        if answer.status == 200 {
            break;
        }
        assert_eq!(answer.status, 429, "{answer:?}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "still held: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(setup.upstream.requests().len(), 2);
}

/// A body that stops arriving is refused once it has paused for the
/// gateway's `body_ms`, so no client holds its counted bytes (and its
/// connection) by sending no more.
#[tokio::test]
async fn a_body_that_stops_arriving_is_refused() {
    let setup = Setup::with_timeouts(vec![], "timeouts: { body_ms: 300 }").await;
    let (_, token) = setup.root("alpha", None).await;
    let started = std::time::Instant::now();
    let headers = [("x-api-key", token.as_str())];
    let answer = http::post_declared(
        setup.server.addr,
        "/v1/messages",
        &headers,
        1_000,
        10,
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(
        answer.body.contains("stopped arriving for 300 ms"),
        "{answer:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(setup.upstream.requests().is_empty());
}

/// A path or a method the gateway does not serve is a `404` in the shape
/// of the API the client speaks, never gRPC's empty `200`, and never
/// reaches the provider: a `GET` of `/v1/responses` (a WebSocket attempt,
/// which the client then makes over HTTP) among them.
#[tokio::test]
async fn paths_the_gateway_does_not_serve_are_404_in_the_apis_shape() {
    let setup = Setup::new(vec![]).await;
    let (_, token) = setup.root("alpha", None).await;
    let bearer = format!("Bearer {token}");
    type Case<'a> = (hyper::Method, &'a str, &'a [(&'a str, &'a str)]);
    let cases: [Case; 7] = [
        (
            hyper::Method::GET,
            "/v1/responses",
            &[("authorization", &bearer)],
        ),
        (
            hyper::Method::POST,
            "/v1beta/models/:generateContent",
            &[("x-goog-api-key", &token)],
        ),
        (
            hyper::Method::POST,
            "/v1beta/models/gemini-test:embedContent",
            &[("x-goog-api-key", &token)],
        ),
        (hyper::Method::GET, "/v1beta/files", &[]),
        (hyper::Method::POST, "/v1/embeddings", &[]),
        (hyper::Method::GET, "/v1/messages", &[("x-api-key", &token)]),
        (
            hyper::Method::POST,
            "/v1/messages/batches",
            &[("x-api-key", &token), ("anthropic-version", "2023-06-01")],
        ),
    ];
    for (method, path, headers) in cases {
        let answer = http::send(method.clone(), &setup.url(path), headers, "{}", LIMIT).await;
        assert_eq!(answer.status, 404, "{method} {path}: {answer:?}");
        let json = answer.json();
        if path.starts_with("/v1/messages") {
            assert_eq!(json["type"], "error", "{json}");
            assert_eq!(json["error"]["type"], "not_found_error", "{json}");
        } else if path.starts_with("/v1beta/") {
            assert_eq!(json["error"]["status"], "NOT_FOUND", "{json}");
        } else {
            assert_eq!(json["error"]["code"], "unknown_url", "{json}");
        }
        assert!(
            json["error"]["message"].as_str().unwrap().contains(path),
            "{json}"
        );
    }
    assert!(setup.upstream.requests().is_empty());
}
