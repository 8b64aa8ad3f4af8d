//! The model gateway's Gemini routes (`POST /v1beta/models/{model}:
//! generateContent`, `:streamGenerateContent?alt=sse`, `:countTokens`, as
//! Gemini CLI calls them), on the backend `TROUPE_TEST_BACKEND` names:
//! relayed and metered, streaming and not, and their refusals in Gemini's
//! shape.

use serde_json::{Value, json};
use troupe_proto::session as pb;
use troupe_session_svc::model::TokenUsage;
use troupe_tests::{
    gateway::*,
    http,
    upstream::{Fault, Turn, Usage},
};

/// A request as Gemini CLI makes it: its system instruction, its contents,
/// its tools as function declarations with JSON schemas; no output bound.
fn cli_request() -> Value {
    json!({
        "systemInstruction": {"parts": [{"text": "You are a worker."}]},
        "contents": [{"role": "user", "parts": [{"text": "hello"}]}],
        "tools": [{"functionDeclarations": [
            {"name": "mcp_troupe_finish", "parametersJsonSchema": {"type": "object"}}]}],
        "generationConfig": {"temperature": 1, "topP": 0.95,
                             "thinkingConfig": {"includeThoughts": true}},
    })
}

async fn post(setup: &Setup, token: &str, method: &str, body: &Value) -> http::Answer {
    let url = setup.url(&format!("/v1beta/models/gemini-test:{method}"));
    http::post(&url, &[("x-goog-api-key", token)], body, LIMIT).await
}

/// Whole and streamed: the agent's token is its `x-goog-api-key`, the
/// provider's key goes as the provider's, the call gets its model's output
/// bound (`generationConfig.maxOutputTokens`) beside the settings it sent,
/// a stream goes as server-sent events, and both calls are metered from
/// the provider's usage metadata (cached tokens as cache reads).
#[tokio::test]
async fn gemini_calls_are_relayed_and_metered() {
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
    let answer = post(&setup, &token, "generateContent", &cli_request()).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let body = answer.json();
    assert_eq!(
        body["candidates"][0]["content"]["parts"][0]["text"],
        "json answer"
    );
    let answer = post(
        &setup,
        &token,
        "streamGenerateContent?alt=sse",
        &cli_request(),
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.body.contains("streamed answer"), "{}", answer.body);
    assert!(
        answer.body.contains("\"finishReason\":\"STOP\""),
        "{}",
        answer.body
    );
    let seen = setup.upstream.requests();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].uri, "/v1beta/models/gemini-test:generateContent");
    assert_eq!(
        seen[1].uri,
        "/v1beta/models/gemini-test:streamGenerateContent?alt=sse"
    );
    for r in &seen {
        assert_eq!(r.header("x-goog-api-key"), Some(KEY));
        assert_eq!(r.header("authorization"), None);
        let config = &r.body["generationConfig"];
        assert_eq!(config["maxOutputTokens"], 400, "{:?}", r.body);
        assert_eq!(config["topP"], 0.95, "{:?}", r.body);
    }
    assert_metered(
        &settled(&setup, &id).await,
        2,
        twice(gpt_tokens()),
        2 * GEMINI_COST,
    );
}

/// `countTokens` answers from the provider and is one call of no tokens.
#[tokio::test]
async fn gemini_count_tokens_is_a_call_of_no_tokens() {
    let setup = Setup::new(vec![]).await;
    let (id, token) = setup.root("alpha", None).await;
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "count me"}]}]});
    let answer = post(&setup, &token, "countTokens", &body).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        answer.json()["totalTokens"].as_u64().is_some(),
        "{answer:?}"
    );
    let usage = settled(&setup, &id).await;
    assert_metered(&usage, 1, TokenUsage::default(), 0);
}

/// Gemini's shape for the routes' refusals, none of which reaches the
/// provider: 401 `UNAUTHENTICATED`; a budget's 429 `RESOURCE_EXHAUSTED`;
/// 400 `INVALID_ARGUMENT` for a model of another API, settings that are no
/// object, an output bound of 0, a model in the body, a guarded field in
/// snake case, a server tool, a file the provider fetches, a cache it stored,
/// too many candidates, a stream not asked as server-sent events; 404 for
/// a method it does not serve.
#[tokio::test]
async fn gemini_refusals_are_in_geminis_shape() {
    let setup = Setup::new(vec![]).await;
    let answer = post(&setup, "nope", "generateContent", &cli_request()).await;
    assert_eq!(answer.status, 401, "{answer:?}");
    assert_eq!(answer.json()["error"]["status"], "UNAUTHENTICATED");
    let spent = pb::Budget {
        model_calls: Some(0),
        ..Default::default()
    };
    let (_, token) = setup.root("alpha", Some(spent)).await;
    let answer = post(&setup, &token, "generateContent", &cli_request()).await;
    assert_eq!(answer.status, 429, "{answer:?}");
    assert_eq!(answer.json()["error"]["status"], "RESOURCE_EXHAUSTED");
    assert_eq!(answer.json()["error"]["code"], 429);
    let (_, token) = setup.root("alpha", None).await;
    let url = setup.url(&format!("/v1beta/models/{MODEL}:generateContent"));
    let answer = http::post(&url, &[("x-goog-api-key", &token)], &cli_request(), LIMIT).await;
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(answer.body.contains("call its API"), "{}", answer.body);
    let edits: [(&str, Value, &str); 8] = [
        (
            "generationConfig",
            json!({"maxOutputTokens": 0}),
            "at least 1",
        ),
        ("model", json!("gemini-test"), "the one its path names"),
        (
            "generation_config",
            json!({"max_output_tokens": 99999}),
            "camel case",
        ),
        (
            "generationConfig",
            json!("hot"),
            "generationConfig: an object",
        ),
        (
            "tools",
            json!([{"googleSearch": {}}]),
            "tools[0].googleSearch: a server tool",
        ),
        (
            "contents",
            json!([{"role": "user", "parts": [{"fileData": {"fileUri": "https://x.example/a"}}]}]),
            "fileData",
        ),
        ("cachedContent", json!("cachedContents/1"), "cachedContent"),
        (
            "generationConfig",
            json!({"candidateCount": 9}),
            "candidateCount",
        ),
    ];
    for (field, value, words) in edits {
        let mut body = cli_request();
        body[field] = value;
        let answer = post(&setup, &token, "generateContent", &body).await;
        assert_eq!(answer.status, 400, "{field}: {answer:?}");
        let error = &answer.json()["error"];
        assert_eq!(error["status"], "INVALID_ARGUMENT", "{field}: {error}");
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains(words), "{field}: {message}");
    }
    let answer = post(&setup, &token, "streamGenerateContent", &cli_request()).await;
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(answer.body.contains("alt=sse"), "{}", answer.body);
    let answer = post(&setup, &token, "embedContent", &cli_request()).await;
    assert_eq!(answer.status, 404, "{answer:?}");
    assert_eq!(answer.json()["error"]["status"], "NOT_FOUND");
    assert!(setup.upstream.requests().is_empty());
}

/// Usage metadata that is no count: the call is charged its reservation.
#[tokio::test]
async fn a_gemini_usage_that_is_no_count_is_charged_its_reservation() {
    let bad = json!({"promptTokenCount": 5, "cachedContentTokenCount": 6});
    let setup = Setup::new(vec![Turn::fault(Fault::Usage(bad))]).await;
    let (id, token) = setup.root("alpha", None).await;
    let answer = post(&setup, &token, "generateContent", &cli_request()).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let sent = setup.upstream.requests()[0].body.clone();
    let bytes = sent.to_string().len() as u64;
    let worst = TokenUsage {
        input: bytes,
        output: 400,
        ..TokenUsage::default()
    };
    let cost = bytes * 1_250_000 + 400 * 10_000_000;
    assert_metered(&settled(&setup, &id).await, 1, worst, cost);
}
