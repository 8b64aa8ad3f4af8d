//! The model gateway's faults, on the backend `TROUPE_TEST_BACKEND` names:
//! the upstream answering 500 or what cannot be read, a stream cut short or
//! stalled or broken off, the upstream down, the client hanging up
//! mid-stream; and a slow stream that is no fault. Each
//! settles the reservation, ends in bounded time and tells the agent.

use std::time::Duration;

use troupe_session_svc::model::TokenUsage;
use troupe_tests::{
    TestServer,
    gateway::*,
    http,
    upstream::{Fault, Turn},
};

/// Each fault ends in bounded time with a clear error in the API's shape,
/// and leaves nothing reserved; a stream cut short before its usage was
/// whole, and an answer whose usage cannot be read, are billed their worst
/// case (what the provider generated, and bills, nobody here saw).
#[tokio::test]
async fn faults_settle_the_reservation_and_tell_the_agent() {
    let setup = Setup::with_timeouts(
        vec![
            Turn::fault(Fault::Status(500)),
            Turn::fault(Fault::Malformed),
            Turn::fault(Fault::Truncated),
            Turn::fault(Fault::Stall),
        ],
        "timeouts: { idle_ms: 500, first_byte_ms: 2000, connect_ms: 1000 }",
    )
    .await;
    let (id, token) = setup.root("alpha", None).await;

    let answer = setup.call(&token, false).await;
    assert_eq!(answer.status, 500, "the provider's own error: {answer:?}");
    assert_eq!(answer.json()["error"]["type"], "api_error");

    let answer = setup.call(&token, false).await;
    assert_eq!(answer.status, 502, "{answer:?}");
    assert!(
        answer.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("could not be read")
    );

    // Truncated: the stream ends with an error event; message_start's
    // input (10 tokens) is billed.
    let answer = setup.call(&token, true).await;
    assert_eq!(answer.status, 200);
    assert!(answer.body.contains("event: error"), "{}", answer.body);
    assert!(
        answer.body.contains("ended before the answer was whole"),
        "{}",
        answer.body
    );

    // Stalled: the idle timeout ends it.
    let answer = setup.call(&token, true).await;
    assert!(
        answer.body.contains("stopped streaming for 500 ms"),
        "{}",
        answer.body
    );

    // The two streams and the answer that could not be read are billed
    // their worst case: their bytes at $3.75/M, 1,000 output tokens.
    let usage = settled(&setup, &id).await;
    let (json, streamed) = (body_len(MODEL, false), body_len(MODEL, true));
    let billed = TokenUsage {
        input: json + 2 * streamed,
        output: 3 * 1_000,
        ..counted_nothing()
    };
    let cost = (json + 2 * streamed) * 3_750_000 + 3 * 1_000 * 15_000_000;
    assert_metered(&usage, 4, billed, cost);
    assert!(!answer.body.contains(KEY));
}

/// The upstream is down: 502 at once, released.
#[tokio::test]
async fn an_upstream_that_is_down_is_a_clear_error_and_releases() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    // A second server whose provider listens nowhere.
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, KEY).unwrap();
    let file = dir.path().join("gateway.yaml");
    std::fs::write(&file, config(&format!("http://127.0.0.1:{port}"), &key, "")).unwrap();
    let down = TestServer::start_with(|c| c.gateway_config = Some(file)).await;
    let (root2, token2) = root_of(&down, "alpha", None).await;
    let id2 = root2.session_id;
    let answer = http::post(
        &format!("http://{}/v1/messages", down.addr),
        &[("x-api-key", &token2)],
        &request(MODEL, true),
        LIMIT,
    )
    .await;
    assert_eq!(answer.status, 502, "{answer:?}");
    let message = answer.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("cannot reach provider scripted"),
        "{message}"
    );
    assert!(!message.contains(KEY));
    let usage = down.get(&id2).await.session.unwrap().usage.unwrap();
    assert_eq!(
        (usage.reserved_calls, usage.own_cost_pico_usd),
        (0, 0),
        "{usage:?}"
    );
}

/// The client hangs up mid-stream and the provider then stalls: the
/// stream is read on no longer than `drain_ms` (well before the idle
/// timeout, 60 s), then the call is settled (cancelled) at its worst case,
/// its final usage never seen, and nothing stays reserved.
#[tokio::test]
async fn a_client_that_hangs_up_mid_stream_is_settled() {
    let setup = Setup::with_timeouts(
        vec![Turn::fault(Fault::Stall)],
        "timeouts: { idle_ms: 60000, drain_ms: 500 }",
    )
    .await;
    let (id, token) = setup.root("alpha", None).await;
    let (first, body) = setup.open_stream(&token).await;
    assert!(String::from_utf8_lossy(&first).contains("message_start"));
    assert_eq!(setup.usage(&id).await.reserved_calls, 1);
    drop(body);
    let usage = settled(&setup, &id).await;
    assert_eq!(usage.own_calls, 1);
    let own = usage.own_tokens.unwrap();
    assert_eq!(
        (own.input, own.output),
        (body_len(MODEL, true), 1_000),
        "{usage:?}"
    );
}

/// The provider's connection breaks mid-stream: the agent reads an error
/// event, and the call is billed its worst case, not the start the
/// provider had reported.
#[tokio::test]
async fn a_stream_that_breaks_off_is_settled_and_told() {
    let setup = Setup::new(vec![Turn::fault(Fault::BreakOff)]).await;
    let (id, token) = setup.root("alpha", None).await;
    let answer = setup.call(&token, true).await;
    assert_eq!(answer.status, 200);
    assert!(answer.body.contains("message_start"), "{}", answer.body);
    assert!(answer.body.contains("event: error"), "{}", answer.body);
    assert!(answer.body.contains("stream broke off"), "{}", answer.body);
    let usage = settled(&setup, &id).await;
    let streamed = body_len(MODEL, true);
    let worst = TokenUsage {
        input: streamed,
        output: 1_000,
        ..counted_nothing()
    };
    assert_metered(&usage, 1, worst, streamed * 3_750_000 + 1_000 * 15_000_000);
}

/// A stream slower in all than the idle deadline, but never silent that
/// long, is relayed whole: the deadline counts from the last frame.
#[tokio::test]
async fn a_slow_stream_that_never_stalls_is_whole() {
    let idle = 300;
    let setup = Setup::with_timeouts(
        vec![Turn::fault(Fault::Drip(Duration::from_millis(idle / 3)))],
        &format!("timeouts: {{ idle_ms: {idle} }}"),
    )
    .await;
    let (id, token) = setup.root("alpha", None).await;
    let started = std::time::Instant::now();
    let answer = setup.call(&token, true).await;
    assert_eq!(answer.status, 200);
    assert!(!answer.body.contains("event: error"), "{}", answer.body);
    assert!(answer.body.contains("message_stop"), "{}", answer.body);
    // Six events, each a third of the deadline after the one before.
    assert!(
        started.elapsed() > Duration::from_millis(idle * 3 / 2),
        "the stream is meant to outlast the idle deadline"
    );
    let usage = settled(&setup, &id).await;
    let whole = TokenUsage {
        input: 10,
        output: 5,
        ..counted_nothing()
    };
    assert_metered(&usage, 1, whole, 10 * 3_000_000 + 5 * 15_000_000);
}
