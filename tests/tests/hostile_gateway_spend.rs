//! The hostile suite of the model gateway's spending, on the backend
//! `TROUPE_TEST_BACKEND` names, against the scripted upstream: a call that
//! multiplies its output (OpenAI's `n`) reserves every completion;
//! `count_tokens` counts as a call and stops with the budget; usage that
//! cannot be read is charged the reservation, not nothing; a client that
//! hangs up is charged what the provider generated, not what it had
//! reported when the client left.

use serde_json::json;
use troupe_proto::session as pb;
use troupe_session_svc::model::TokenUsage;
use troupe_tests::{
    gateway::*,
    http,
    upstream::{Fault, Turn, Usage},
};

/// The worst case of `request(MODEL, false)` at the test price: its bytes
/// at $3.75/M, 1,000 output tokens at $15/M.
fn worst_cost() -> u64 {
    body_len(MODEL, false) * 3_750_000 + 1_000 * 15_000_000
}

fn worst_tokens() -> TokenUsage {
    TokenUsage {
        input: body_len(MODEL, false),
        output: 1_000,
        ..TokenUsage::default()
    }
}

/// `n` completions of up to 1,000 tokens each reserve n × 1,000: fifty
/// of them on a 5,000-token budget are refused before the upstream; two
/// fit, and their usage is what the provider reports. `n` that is not a
/// count of 1 to 128 is refused.
#[tokio::test]
async fn every_completion_asked_for_is_reserved() {
    let usage = Usage {
        input_tokens: 20,
        output_tokens: 1_900,
        ..Usage::default()
    };
    let setup = Setup::new(vec![Turn::text("two").with_usage(usage)]).await;
    let budget = pb::Budget {
        tokens: Some(5_000),
        ..Default::default()
    };
    let (id, token) = setup.root("alpha", Some(budget)).await;
    let bearer = format!("Bearer {token}");
    let call = |n: serde_json::Value| {
        let mut body = chat(false);
        body["n"] = n;
        body["max_completion_tokens"] = json!(1_000);
        let url = setup.url("/v1/chat/completions");
        let bearer = bearer.clone();
        async move { http::post(&url, &[("authorization", &bearer)], &body, LIMIT).await }
    };
    let answer = call(json!(50)).await;
    assert_eq!(answer.status, 429, "{answer:?}");
    assert_eq!(answer.json()["error"]["code"], "insufficient_quota");
    assert!(
        answer.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tokens budget is 5000"),
        "{}",
        answer.body
    );
    for bad in [json!(0), json!(129), json!(1.5), json!("2")] {
        let answer = call(bad.clone()).await;
        assert_eq!(answer.status, 400, "n = {bad}: {answer:?}");
    }
    assert!(setup.upstream.requests().is_empty());
    let answer = call(json!(2)).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let usage = settled(&setup, &id).await;
    assert_eq!(usage.own_calls, 1, "{usage:?}");
    assert_eq!(usage.own_tokens.unwrap().output, 1_900, "{usage:?}");
}

/// `count_tokens` counts against the session's calls (a calls budget of two
/// takes two, the third is refused), and once a budget is spent it is
/// refused like any call, before the upstream.
#[tokio::test]
async fn count_tokens_counts_as_a_call_and_stops_with_the_budget() {
    let setup = Setup::new(vec![Turn::text("spends it all").with_usage(USAGE)]).await;
    let url = setup.url("/v1/messages/count_tokens");
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "count me"}]});
    let calls = pb::Budget {
        model_calls: Some(2),
        ..Default::default()
    };
    let (id, token) = setup.root("alpha", Some(calls)).await;
    for _ in 0..2 {
        let answer = http::post(&url, &[("x-api-key", &token)], &body, LIMIT).await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    let answer = http::post(&url, &[("x-api-key", &token)], &body, LIMIT).await;
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(answer.body.contains("budget exceeded"), "{}", answer.body);
    let usage = settled(&setup, &id).await;
    assert_eq!(
        (usage.own_calls, usage.own_cost_pico_usd),
        (2, 0),
        "{usage:?}"
    );
    assert_eq!(setup.upstream.requests().len(), 2);

    // A cost budget of one call's worst case, which the call's usage
    // passes: spent, so counting is refused too.
    let cost = pb::Budget {
        cost_pico_usd: Some(worst_cost()),
        ..Default::default()
    };
    let (_, token) = setup.root("alpha", Some(cost)).await;
    assert_eq!(setup.call(&token, false).await.status, 200);
    let answer = http::post(&url, &[("x-api-key", &token)], &body, LIMIT).await;
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(answer.body.contains("cost budget"), "{}", answer.body);
    assert_eq!(setup.upstream.requests().len(), 3);
}

/// A usage the provider reports that is no count (past any call's
/// possible size, `i64::MAX`, negative, fractional, text) is charged the
/// call's reservation at once: nothing stays reserved, and the call costs
/// its worst case, not nothing.
#[tokio::test]
async fn usage_that_cannot_be_read_is_charged_the_reservation() {
    let bad = [
        json!({"input_tokens": i64::MAX, "output_tokens": 1}),
        json!({"input_tokens": 10, "output_tokens": -5}),
        json!({"input_tokens": 10, "output_tokens": 2.5}),
        json!({"input_tokens": "10", "output_tokens": 2}),
        json!("all of it"),
    ];
    let turns = bad
        .iter()
        .map(|u| Turn::fault(Fault::Usage(u.clone())))
        .collect();
    let setup = Setup::new(turns).await;
    for usage in &bad {
        let (id, token) = setup.root("alpha", None).await;
        let answer = setup.call(&token, false).await;
        assert_eq!(answer.status, 200, "{usage}: {answer:?}");
        let usage_now = setup.usage(&id).await;
        assert_metered(&usage_now, 1, worst_tokens(), worst_cost());
    }
}

/// The client hangs up mid-stream: the provider goes on generating the
/// answer, so the gateway reads on, and charges the final usage the
/// provider reports, not the start's.
#[tokio::test]
async fn a_client_that_hangs_up_is_charged_what_the_provider_generated() {
    // About 40 KB of events at 20 KB/s: two seconds, the first piece at once.
    let turn = Turn::deltas(&"x".repeat(100), 300).with_usage(USAGE);
    let setup = Setup::new(vec![Turn {
        fault: Some(Fault::Pace(20_000)),
        ..turn
    }])
    .await;
    let (id, token) = setup.root("alpha", None).await;
    let (first, body) = setup.open_stream(&token).await;
    assert!(String::from_utf8_lossy(&first).contains("message_start"));
    drop(body);
    let usage = settled(&setup, &id).await;
    assert_metered(&usage, 1, scripted(), USAGE_COST);
}

/// The client hangs up and the stream then stalls: its final usage is
/// never seen, so the call is charged its worst case once the idle
/// deadline ends the reading; never less.
#[tokio::test]
async fn a_client_that_hangs_up_on_a_stream_without_its_usage_is_charged_the_worst_case() {
    let setup = Setup::with_timeouts(
        vec![Turn::fault(Fault::Stall)],
        "timeouts: { idle_ms: 300 }",
    )
    .await;
    let (id, token) = setup.root("alpha", None).await;
    let (_first, body) = setup.open_stream(&token).await;
    drop(body);
    let usage = settled(&setup, &id).await;
    let worst = TokenUsage {
        input: body_len(MODEL, true),
        output: 1_000,
        ..TokenUsage::default()
    };
    let cost = body_len(MODEL, true) * 3_750_000 + 1_000 * 15_000_000;
    assert_metered(&usage, 1, worst, cost);
}
