//! The model gateway's OpenAI route (`POST /v1/chat/completions`), on the
//! backend `TROUPE_TEST_BACKEND` names: relayed and metered, streaming
//! and not, and its refusals in OpenAI's shape.

use serde_json::json;
use troupe_proto::session as pb;
use troupe_tests::{
    gateway::*,
    http,
    upstream::{Turn, Usage},
};

/// OpenAI's route, streaming and not, with a Bearer token: the provider's
/// key goes as its Bearer; a stream asks for the usage chunk; a call with
/// no bound gets the model's (`max_output_tokens`); both calls are metered
/// from the provider's usage (cached prompt tokens as cache reads).
#[tokio::test]
async fn openai_chat_completions_are_relayed_and_metered() {
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
    let bearer = format!("Bearer {token}");
    let url = setup.url("/v1/chat/completions");
    let answer = http::post(&url, &[("authorization", &bearer)], &chat(false), LIMIT).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        answer.json()["choices"][0]["message"]["content"],
        "json answer"
    );
    let answer = http::post(&url, &[("authorization", &bearer)], &chat(true), LIMIT).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.body.contains("streamed answer"), "{}", answer.body);
    assert!(answer.body.contains("data: [DONE]"), "{}", answer.body);
    let seen = setup.upstream.requests();
    assert_eq!(seen.len(), 2);
    for r in &seen {
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {KEY}").as_str())
        );
        assert_eq!(r.header("x-api-key"), None);
        assert_eq!(r.body["max_completion_tokens"], 300, "{:?}", r.body);
    }
    assert_eq!(seen[1].body["stream_options"]["include_usage"], true);
    assert_metered(
        &settled(&setup, &id).await,
        2,
        twice(gpt_tokens()),
        2 * GPT_COST,
    );
}

/// OpenAI's shape for its refusals: 401 `invalid_api_key`, and a budget's
/// 429 `insufficient_quota`; an Anthropic model on OpenAI's route is 400.
#[tokio::test]
async fn openai_refusals_are_in_openais_shape() {
    let setup = Setup::new(vec![]).await;
    let url = setup.url("/v1/chat/completions");
    let answer = http::post(
        &url,
        &[("authorization", "Bearer nope")],
        &chat(false),
        LIMIT,
    )
    .await;
    assert_eq!(answer.status, 401, "{answer:?}");
    assert_eq!(answer.json()["error"]["code"], "invalid_api_key");
    let (_, token) = setup
        .root(
            "alpha",
            Some(pb::Budget {
                model_calls: Some(0),
                ..Default::default()
            }),
        )
        .await;
    let bearer = format!("Bearer {token}");
    let answer = http::post(&url, &[("authorization", &bearer)], &chat(true), LIMIT).await;
    assert_eq!(answer.status, 429, "{answer:?}");
    let body = answer.json();
    assert_eq!(body["error"]["type"], "insufficient_quota", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("model_calls budget is 0"),
        "{body}"
    );
    let (_, token) = setup.root("alpha", None).await;
    let bearer = format!("Bearer {token}");
    let mut wrong = chat(false);
    wrong["model"] = json!(MODEL);
    let answer = http::post(&url, &[("authorization", &bearer)], &wrong, LIMIT).await;
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(setup.upstream.requests().is_empty());
}
