//! The model gateway's Responses route (`POST /v1/responses`, the API Codex
//! speaks), on the backend `TROUPE_TEST_BACKEND` names: relayed and
//! metered, streaming and not, Codex's client tools let through, and its
//! refusals in OpenAI's shape: a server tool, what the provider stored of
//! earlier calls, a call in the background, a spent budget.

use serde_json::{Value, json};
use troupe_proto::session as pb;
use troupe_session_svc::model::TokenUsage;
use troupe_tests::{
    gateway::*,
    http,
    upstream::{Fault, Turn, Usage},
};

/// A Responses request as Codex makes it: its instructions, its input, its
/// own tools (functions, a free-form patch tool, the shell) and Troupe's
/// MCP server as a namespace of functions; no output bound.
fn codex(stream: bool) -> Value {
    json!({
        "model": "gpt-test",
        "stream": stream,
        "store": false,
        "instructions": "You are a worker.",
        "input": [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "hello"}]}],
        "tools": [
            {"type": "function", "name": "update_plan", "parameters": {"type": "object"}},
            {"type": "custom", "name": "apply_patch"},
            {"type": "local_shell"},
            {"type": "namespace", "name": "mcp__troupe", "tools": [
                {"type": "function", "name": "finish", "parameters": {"type": "object"}}]},
        ],
        "include": ["reasoning.encrypted_content"],
    })
}

async fn post(setup: &Setup, token: &str, body: &Value) -> http::Answer {
    let bearer = format!("Bearer {token}");
    let url = setup.url("/v1/responses");
    http::post(&url, &[("authorization", &bearer)], body, LIMIT).await
}

/// Whole and streamed: the provider's key goes as its Bearer, the call
/// gets its model's output bound (`max_output_tokens`), Codex's tools reach
/// the provider as sent, nothing is stored there, and both calls are metered from the provider's
/// usage (cached input as cache reads), to the token and the price.
#[tokio::test]
async fn responses_are_relayed_and_metered() {
    let usage = Usage {
        cache_creation_input_tokens: 0,
        ..USAGE
    };
    let setup = Setup::new(vec![
        Turn::text("json answer").with_usage(usage),
        Turn::text("streamed answer").with_usage(usage),
    ])
    .await;
    let (id, token) = setup.root("alpha", None).await;
    let answer = post(&setup, &token, &codex(false)).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let body = answer.json();
    assert_eq!(body["output"][0]["content"][0]["text"], "json answer");
    assert_eq!(body["usage"]["input_tokens"], 11_234);
    // Asked to store its answer at the provider (OpenAI's default), it
    // stores nothing: no other call may read it back.
    let mut stored = codex(true);
    stored["store"] = json!(true);
    let answer = post(&setup, &token, &stored).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.body.contains("streamed answer"), "{}", answer.body);
    assert!(
        answer.body.contains("event: response.completed"),
        "{}",
        answer.body
    );
    let seen = setup.upstream.requests();
    assert_eq!(seen.len(), 2);
    for r in &seen {
        assert_eq!(r.uri, "/v1/responses");
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {KEY}").as_str())
        );
        assert_eq!(r.header("x-api-key"), None);
        assert_eq!(r.body["max_output_tokens"], 300, "{:?}", r.body);
        assert_eq!(r.body["stream_options"], Value::Null, "{:?}", r.body);
        assert_eq!(r.body["tools"], codex(false)["tools"]);
        assert_eq!(r.body["store"], false, "{:?}", r.body);
    }
    assert_metered(
        &settled(&setup, &id).await,
        2,
        twice(gpt_tokens()),
        2 * GPT_COST,
    );
}

/// OpenAI's shape for the route's refusals, none of which reaches the
/// provider: 401 `invalid_api_key`; a budget's 429 `insufficient_quota`;
/// 400 for an Anthropic model, a server tool (even inside a namespace),
/// what the provider stored (a previous response, an item by reference), a
/// call in the background, and an output bound that is no count.
#[tokio::test]
async fn responses_refusals_are_in_openais_shape() {
    let setup = Setup::new(vec![]).await;
    let answer = post(&setup, "nope", &codex(false)).await;
    assert_eq!(answer.status, 401, "{answer:?}");
    assert_eq!(answer.json()["error"]["code"], "invalid_api_key");
    let spent = pb::Budget {
        model_calls: Some(0),
        ..Default::default()
    };
    let (_, token) = setup.root("alpha", Some(spent)).await;
    let answer = post(&setup, &token, &codex(true)).await;
    assert_eq!(answer.status, 429, "{answer:?}");
    assert_eq!(answer.json()["error"]["type"], "insufficient_quota");
    let (_, token) = setup.root("alpha", None).await;
    let edits: [(&str, Value, &str); 7] = [
        ("model", json!(MODEL), "call its API"),
        (
            "tools",
            json!([{"type": "web_search"}]),
            "tools[0]: a server tool",
        ),
        (
            "tools",
            json!([{"type": "namespace", "name": "n", "tools": [{"type": "mcp", "server_url": "https://x"}]}]),
            "tools[0].tools[0]: a server tool",
        ),
        (
            "previous_response_id",
            json!("resp_1"),
            "previous_response_id",
        ),
        (
            "input",
            json!([{"type": "item_reference", "id": "msg_1"}]),
            "input[0]",
        ),
        ("background", json!(true), "background"),
        ("max_output_tokens", json!(-1), "max_output_tokens"),
    ];
    for (field, value, words) in edits {
        let mut body = codex(false);
        body[field] = value;
        let answer = post(&setup, &token, &body).await;
        assert_eq!(answer.status, 400, "{field}: {answer:?}");
        let error = &answer.json()["error"];
        assert_eq!(error["type"], "invalid_request_error", "{field}: {error}");
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains(words), "{field}: {message}");
    }
    assert!(setup.upstream.requests().is_empty());
}

/// A provider whose usage is no count (negative, fractional, more cached
/// than there was input): the call is charged its reservation, the body's
/// bytes as input at the dearest input price and the model's whole output
/// bound, never less.
#[tokio::test]
async fn a_responses_usage_that_is_no_count_is_charged_its_reservation() {
    let bad = [
        json!({"input_tokens": -5, "output_tokens": 2}),
        json!({"input_tokens": 1.5, "output_tokens": 2}),
        json!({"input_tokens": 5, "input_tokens_details": {"cached_tokens": 6}, "output_tokens": 2}),
    ];
    let turns = bad
        .iter()
        .map(|u| Turn::fault(Fault::Usage(u.clone())))
        .collect();
    let setup = Setup::new(turns).await;
    for usage in &bad {
        let (id, token) = setup.root("alpha", None).await;
        let answer = post(&setup, &token, &codex(false)).await;
        assert_eq!(answer.status, 200, "{usage}: {answer:?}");
        let sent = setup
            .upstream
            .requests()
            .last()
            .expect("a call")
            .body
            .clone();
        let bytes = sent.to_string().len() as u64;
        let worst = TokenUsage {
            input: bytes,
            output: 300,
            ..TokenUsage::default()
        };
        let cost = bytes * 2_500_000 + 300 * 10_000_000;
        assert_metered(&settled(&setup, &id).await, 1, worst, cost);
    }
}

/// A provider's stream cut before its end: the agent's client reads the
/// gateway's `error` event in the Responses shape as the stream's last, and
/// the call, its usage never reported, is charged its reservation.
#[tokio::test]
async fn a_responses_stream_cut_short_ends_with_an_error_event() {
    let setup = Setup::new(vec![Turn::fault(Fault::Truncated)]).await;
    let (id, token) = setup.root("alpha", None).await;
    let answer = post(&setup, &token, &codex(true)).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        answer.body.contains("event: response.created"),
        "{}",
        answer.body
    );
    let last = answer
        .body
        .trim_end()
        .rsplit("\n\n")
        .next()
        .unwrap_or_default();
    let data = last
        .strip_prefix("event: error\ndata: ")
        .unwrap_or_else(|| panic!("the last event is an error: {}", answer.body));
    let event: Value = serde_json::from_str(data).expect("JSON");
    assert_eq!(event["type"], "error", "{event}");
    assert_eq!(event["code"], "server_error", "{event}");
    let message = event["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("ended before the answer was whole"),
        "{message}"
    );
    let sent = setup.upstream.requests()[0].body.to_string().len() as u64;
    let worst = TokenUsage {
        input: sent,
        output: 300,
        ..TokenUsage::default()
    };
    let cost = sent * 2_500_000 + 300 * 10_000_000;
    assert_metered(&settled(&setup, &id).await, 1, worst, cost);
}
