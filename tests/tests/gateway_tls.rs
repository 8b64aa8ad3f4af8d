//! The model gateway to a provider over TLS (`https://` base URL), on the
//! backend `TROUPE_TEST_BACKEND` names, against the scripted upstream
//! serving a certificate of a CA made for the test: trusted through the
//! provider's `ca_file`, a call is relayed and metered as over plain HTTP;
//! a certificate that does not verify (its CA not trusted, or made for
//! another name) is the provider-shaped upstream error, the call reaches
//! no handler of the upstream, and its reservation is released.

use troupe_session_svc::model::TokenUsage;
use troupe_tests::{
    gateway::*,
    upstream::{Turn, Upstream},
};

/// Names the upstream's certificate is good for.
const HERE: [&str; 2] = ["localhost", "127.0.0.1"];

#[tokio::test]
async fn calls_over_tls_are_relayed_and_metered_as_over_plain_http() {
    let upstream = Upstream::tls(
        vec![
            Turn::text("streamed over tls").with_usage(USAGE),
            Turn::text("json over tls").with_usage(USAGE),
        ],
        &HERE,
    )
    .await;
    let ca = upstream.tls_info().ca_pem.clone();
    // By name: the certificate is checked against `localhost`.
    let base_url = format!("https://localhost:{}", upstream.port());
    let setup = Setup::over(upstream, &base_url, Some(&ca)).await;
    let (id, token) = setup.root("alpha", None).await;

    let answer = setup.call(&token, true).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    for event in ["message_start", "streamed over tls", "message_stop"] {
        assert!(answer.body.contains(event), "{event} in {}", answer.body);
    }
    let answer = setup.call(&token, false).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.json()["content"][0]["text"], "json over tls");

    let seen = setup.upstream.requests();
    assert_eq!(seen.len(), 2, "{seen:#?}");
    for request in &seen {
        assert_eq!(request.api_key(), Some(KEY));
        assert_eq!(request.uri, "/v1/messages?beta=true");
    }
    assert!(seen[0].streams() && !seen[1].streams());
    let one = scripted();
    let twice = TokenUsage {
        input: 2 * one.input,
        output: 2 * one.output,
        cache_read: 2 * one.cache_read,
        cache_write: 2 * one.cache_write,
    };
    assert_metered(&settled(&setup, &id).await, 2, twice, 2 * USAGE_COST);
    assert_eq!(
        setup.upstream.tls_info().handshake_failures(),
        Vec::<String>::new()
    );
}

/// A streamed call and a JSON call to an upstream whose certificate does
/// not verify: each a 502 `api_error` naming the certificate's fault, none
/// reaching the upstream's handler (its handshakes failed), nothing
/// reserved or billed after.
async fn refused_by_tls(setup: &Setup, fault: &str) {
    let (id, token) = setup.root("alpha", None).await;
    for stream in [true, false] {
        let answer = setup.call(&token, stream).await;
        assert_eq!(answer.status, 502, "{answer:?}");
        let body = answer.json();
        assert_eq!(body["type"], "error", "{body}");
        assert_eq!(body["error"]["type"], "api_error", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("cannot reach provider scripted") && message.contains(fault),
            "{message}"
        );
        assert!(!answer.body.contains(KEY), "{answer:?}");
    }
    assert!(setup.upstream.requests().is_empty(), "reached the handler");
    // The gateway gave up on the handshake: the upstream sees it fail.
    setup
        .upstream
        .tls_info()
        .wait_for_handshake_failures(2, LIMIT)
        .await;
    let usage = settled(setup, &id).await;
    assert_eq!(
        (
            usage.reserved_calls,
            usage.reserved_cost_pico_usd,
            usage.own_cost_pico_usd,
            usage.subtree_tokens
        ),
        (0, 0, 0, 0),
        "{usage:?}"
    );
}

#[tokio::test]
async fn a_certificate_of_an_untrusted_ca_is_an_upstream_error_and_releases() {
    let upstream = Upstream::tls(vec![Turn::text("never")], &HERE).await;
    let base_url = upstream.base_url();
    // No `ca_file`: the Mozilla roots alone do not know the test's CA.
    let setup = Setup::over(upstream, &base_url, None).await;
    refused_by_tls(&setup, "UnknownIssuer").await;
}

#[tokio::test]
async fn a_certificate_for_another_name_is_an_upstream_error_and_releases() {
    let upstream = Upstream::tls(vec![Turn::text("never")], &["elsewhere.example"]).await;
    let ca = upstream.tls_info().ca_pem.clone();
    let base_url = upstream.base_url();
    // Its CA trusted, but the certificate is not 127.0.0.1's.
    let setup = Setup::over(upstream, &base_url, Some(&ca)).await;
    refused_by_tls(&setup, "not valid for name").await;
}
