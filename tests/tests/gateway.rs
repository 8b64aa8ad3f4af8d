//! The model gateway through the session service, on the backend
//! `TROUPE_TEST_BACKEND` names (`scripts/test` runs it again on
//! PostgreSQL), against the scripted upstream: a call is the token's
//! session's and goes upstream with the provider's key only; it is metered
//! to the token and the price, streaming or not; a call past a budget, or
//! without a live session's token, never reaches the upstream; and every
//! fault settles the reservation, ends in bounded time and tells the agent.

use std::time::Duration;

use serde_json::{Value, json};
use troupe_proto::session::{self as pb, TrustLevel};
use troupe_session_svc::model::TokenUsage;
use troupe_tests::{
    OPERATOR_TOKEN, TestServer,
    http::{self, Answer},
    terminate,
    upstream::{Fault, Turn, Upstream, Usage},
};

const KEY: &str = "sk-ant-provider-key-never-in-a-container";
const MODEL: &str = "claude-test";
const LIMIT: Duration = Duration::from_secs(20);

/// $3/M input, $15/M output, $0.30/M cache read, $3.75/M cache write.
fn config(upstream: &str, key_file: &std::path::Path, timeouts: &str) -> String {
    format!(
        r#"
providers:
  scripted:
    kind: anthropic
    base_url: {upstream}
    key_file: {key}
    models:
      {MODEL}: {{ input: "3", output: "15", cache_read: "0.30", cache_write: "3.75" }}
      claude-other: {{ input: "1", output: "1" }}
  openai:
    kind: openai
    base_url: {upstream}
    key_file: {key}
    models:
      gpt-test: {{ input: "2.50", output: "10", cache_read: "1.25", max_output_tokens: 300 }}
access:
  workspaces:
    narrow: [claude-other]
{timeouts}
"#,
        key = key_file.display()
    )
}

struct Setup {
    server: TestServer,
    upstream: Upstream,
    _dir: tempfile::TempDir,
}

impl Setup {
    async fn new(turns: Vec<Turn>) -> Setup {
        Setup::with_timeouts(turns, "").await
    }

    async fn with_timeouts(turns: Vec<Turn>, timeouts: &str) -> Setup {
        let upstream = Upstream::tcp(turns).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let key = dir.path().join("key");
        std::fs::write(&key, format!("{KEY}\n")).expect("key file");
        let file = dir.path().join("gateway.yaml");
        std::fs::write(&file, config(&upstream.base_url(), &key, timeouts)).expect("config");
        let server = TestServer::start_with(|c| c.gateway_config = Some(file)).await;
        Setup {
            server,
            upstream,
            _dir: dir,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.addr)
    }

    async fn root(&self, workspace: &str, budget: Option<pb::Budget>) -> (String, String) {
        let response = self
            .server
            .operator()
            .await
            .create_root_session(pb::CreateRootSessionRequest {
                workspace_id: workspace.to_owned(),
                trust_level: TrustLevel::Direct as i32,
                agent_name: "worker".to_owned(),
                budget,
                ..Default::default()
            })
            .await
            .expect("root")
            .into_inner();
        (
            response.session.expect("session").session_id,
            response.session_token,
        )
    }

    async fn call(&self, token: &str, stream: bool) -> Answer {
        self.call_model(token, MODEL, stream).await
    }

    async fn call_model(&self, token: &str, model: &str, stream: bool) -> Answer {
        http::post(
            &self.url("/v1/messages?beta=true"),
            &[("x-api-key", token), ("anthropic-version", "2023-06-01")],
            &request(model, stream),
            LIMIT,
        )
        .await
    }

    async fn usage(&self, session_id: &str) -> pb::SessionUsage {
        self.server
            .get(session_id)
            .await
            .session
            .expect("session")
            .usage
            .expect("usage")
    }
}

fn request(model: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "max_tokens": 1000,
        "stream": stream,
        "messages": [{"role": "user", "content": "hello"}],
    })
}

fn body_len(model: &str, stream: bool) -> u64 {
    request(model, stream).to_string().len() as u64
}

const USAGE: Usage = Usage {
    input_tokens: 1_234,
    output_tokens: 567,
    cache_read_input_tokens: 10_000,
    cache_creation_input_tokens: 2_000,
};

/// 1,234 × $3/M + 567 × $15/M + 10,000 × $0.30/M + 2,000 × $3.75/M.
const USAGE_COST: u64 = 1_234 * 3_000_000 + 567 * 15_000_000 + 10_000 * 300_000 + 2_000 * 3_750_000;

fn assert_metered(usage: &pb::SessionUsage, calls: u64, tokens: TokenUsage, cost: u64) {
    let own = usage.own_tokens.expect("own tokens");
    assert_eq!(usage.own_calls, calls, "{usage:?}");
    assert_eq!(
        (own.input, own.output, own.cache_read, own.cache_write),
        (
            tokens.input,
            tokens.output,
            tokens.cache_read,
            tokens.cache_write
        ),
        "{usage:?}"
    );
    assert_eq!(usage.own_cost_pico_usd, cost, "{usage:?}");
    assert_eq!(usage.subtree_cost_pico_usd, cost, "{usage:?}");
    assert_eq!(usage.subtree_tokens, tokens.total(), "{usage:?}");
    assert_eq!(
        (
            usage.reserved_calls,
            usage.reserved_tokens,
            usage.reserved_cost_pico_usd
        ),
        (0, 0, 0),
        "nothing stays reserved: {usage:?}"
    );
}

fn scripted() -> TokenUsage {
    TokenUsage {
        input: 1_234,
        output: 567,
        cache_read: 10_000,
        cache_write: 2_000,
    }
}

/// Polls `session_id`'s usage until nothing is reserved (a relay settles
/// just after its last byte).
async fn settled(setup: &Setup, session_id: &str) -> pb::SessionUsage {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let usage = setup.usage(session_id).await;
        if usage.reserved_calls == 0 {
            return usage;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still reserved: {usage:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_streamed_call_is_relayed_and_metered_to_the_token_and_the_price() {
    let setup = Setup::new(vec![Turn::text("streamed hello").with_usage(USAGE)]).await;
    let (id, token) = setup.root("alpha", None).await;
    let answer = setup.call(&token, true).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        answer.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"),
        "{answer:?}"
    );
    for event in [
        "message_start",
        "content_block_delta",
        "streamed hello",
        "message_stop",
    ] {
        assert!(answer.body.contains(event), "{event} in {}", answer.body);
    }
    let seen = setup.upstream.requests();
    assert_eq!(seen.len(), 1);
    // The provider's key replaced the agent's; the path and query are kept.
    assert_eq!(seen[0].api_key(), Some(KEY));
    assert_eq!(seen[0].header("authorization"), None);
    assert_eq!(seen[0].uri, "/v1/messages?beta=true");
    assert_eq!(seen[0].header("anthropic-version"), Some("2023-06-01"));
    assert!(seen[0].streams());
    assert_metered(&settled(&setup, &id).await, 1, scripted(), USAGE_COST);
}

#[tokio::test]
async fn a_json_call_is_metered_and_so_is_its_tree() {
    let setup = Setup::new(vec![
        Turn::text("one").with_usage(USAGE),
        Turn::text("two").with_usage(USAGE),
    ])
    .await;
    let (root, root_token) = setup.root("alpha", None).await;
    let mut agent = setup.server.client(Some(&root_token)).await;
    let child = troupe_tests::create_child(&mut agent, troupe_tests::child("worker")).await;
    let child_token = setup.server.token_for(&child.session_id).await;
    let answer = setup.call(&root_token, false).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.json()["content"][0]["text"], "one");
    assert_eq!(answer.json()["usage"]["input_tokens"], 1_234);
    let answer = setup.call(&child_token, false).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_metered(
        &setup.usage(&child.session_id).await,
        1,
        scripted(),
        USAGE_COST,
    );
    let tree = setup.usage(&root).await;
    assert_eq!(tree.own_calls, 1);
    assert_eq!(tree.own_cost_pico_usd, USAGE_COST);
    assert_eq!(tree.subtree_calls, 2);
    assert_eq!(tree.subtree_cost_pico_usd, 2 * USAGE_COST);
    assert_eq!(tree.subtree_tokens, 2 * scripted().total());
}

/// No token, a token that is no session's, the operator's, and the token
/// of a session that has ended: each refused 401 (the operator 403) in the
/// Anthropic shape, before the upstream; refusals audited.
#[tokio::test]
async fn calls_without_a_live_sessions_token_never_reach_the_upstream() {
    let setup = Setup::new(vec![Turn::text("never")]).await;
    let (ended, ended_token) = setup.root("alpha", None).await;
    setup
        .server
        .operator()
        .await
        .terminate_session(terminate(ended.clone()))
        .await
        .expect("terminated");
    let forged = format!("{}x", &ended_token[..ended_token.len() - 1]);
    type Case<'a> = (&'a [(&'a str, &'a str)], u16, &'a str);
    let cases: [Case; 5] = [
        (&[], 401, "missing credentials"),
        (
            &[("x-api-key", "not-a-token")],
            401,
            "invalid session token",
        ),
        (
            &[("authorization", "Bearer not-a-token")],
            401,
            "invalid session token",
        ),
        (&[("x-api-key", &ended_token)], 401, "has ended"),
        (&[("x-api-key", OPERATOR_TOKEN)], 403, "operator token"),
    ];
    for (headers, status, words) in cases {
        let answer = http::post(
            &setup.url("/v1/messages"),
            headers,
            &request(MODEL, true),
            LIMIT,
        )
        .await;
        assert_eq!(answer.status, status, "{headers:?}: {answer:?}");
        let body = answer.json();
        assert_eq!(body["type"], "error", "{body}");
        let kind = if status == 401 {
            "authentication_error"
        } else {
            "permission_error"
        };
        assert_eq!(body["error"]["type"], kind, "{body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(words),
            "{body}"
        );
        assert!(!answer.body.contains(KEY));
    }
    let answer = http::post(
        &setup.url("/v1/messages"),
        &[("x-api-key", &forged)],
        &request(MODEL, false),
        LIMIT,
    )
    .await;
    assert_eq!(answer.status, 401);
    assert!(setup.upstream.requests().is_empty());
    let audit = setup
        .server
        .operator()
        .await
        .list_audit(pb::ListAuditRequest::default())
        .await
        .expect("audit")
        .into_inner();
    let refused = audit
        .entries
        .iter()
        .filter(|e| e.action == "model_call" && !e.allowed)
        .count();
    assert_eq!(refused, 6, "{:#?}", audit.entries);
}

/// A model the workspace may not use, or none configured, is refused 403
/// before the upstream.
#[tokio::test]
async fn a_model_outside_the_workspaces_list_is_refused() {
    let setup = Setup::new(vec![Turn::text("never")]).await;
    let (_, token) = setup.root("narrow", None).await;
    let answer = setup.call(&token, false).await;
    assert_eq!(answer.status, 403, "{answer:?}");
    assert_eq!(answer.json()["error"]["type"], "permission_error");
    let (_, token) = setup.root("alpha", None).await;
    let answer = setup.call_model(&token, "claude-unknown", false).await;
    assert_eq!(answer.status, 403, "{answer:?}");
    assert!(setup.upstream.requests().is_empty());
}

/// With exactly one call's worst case left, one call goes; the next is
/// refused before the upstream, in Anthropic's shape, naming the budget,
/// its dimension and what is used.
#[tokio::test]
async fn a_call_past_the_budget_is_refused_before_the_upstream() {
    let setup = Setup::new(vec![Turn::text("one").with_usage(USAGE), Turn::text("two")]).await;
    // Worst case: body bytes at $3.75/M + 1,000 at $15/M.
    let worst = body_len(MODEL, false) * 3_750_000 + 1_000 * 15_000_000;
    let budget = pb::Budget {
        cost_pico_usd: Some(worst + USAGE_COST - 1),
        ..Default::default()
    };
    let (id, token) = setup.root("alpha", Some(budget)).await;
    let answer = setup.call(&token, false).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let answer = setup.call(&token, false).await;
    assert_eq!(answer.status, 400, "{answer:?}");
    let body = answer.json();
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("budget exceeded: session {id}'s cost budget")),
        "{message}"
    );
    assert_eq!(
        setup.upstream.requests().len(),
        1,
        "the refused call went upstream"
    );
    assert_metered(&setup.usage(&id).await, 1, scripted(), USAGE_COST);
}

fn counted_nothing() -> TokenUsage {
    TokenUsage::default()
}

/// Each fault ends in bounded time with a clear error in the API's shape,
/// and leaves nothing reserved; a stream cut short is billed what the
/// provider reported of it.
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

    let usage = settled(&setup, &id).await;
    let two_starts = TokenUsage {
        input: 20,
        output: 2,
        ..counted_nothing()
    };
    assert_metered(&usage, 4, two_starts, 20 * 3_000_000 + 2 * 15_000_000);
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
    let (id2, token2) = {
        let response = down
            .operator()
            .await
            .create_root_session(pb::CreateRootSessionRequest {
                workspace_id: "alpha".to_owned(),
                trust_level: TrustLevel::Direct as i32,
                agent_name: "worker".to_owned(),
                ..Default::default()
            })
            .await
            .expect("root")
            .into_inner();
        (response.session.unwrap().session_id, response.session_token)
    };
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

/// The client hangs up mid-stream: the call is settled (cancelled) with
/// what the provider had reported, and nothing stays reserved.
#[tokio::test]
async fn a_client_that_hangs_up_mid_stream_is_settled() {
    let setup = Setup::with_timeouts(
        vec![Turn::fault(Fault::Stall)],
        "timeouts: { idle_ms: 60000 }",
    )
    .await;
    let (id, token) = setup.root("alpha", None).await;
    let (status, mut body) = http::post_stream(
        &setup.url("/v1/messages"),
        &[("x-api-key", &token)],
        &request(MODEL, true),
    )
    .await;
    assert_eq!(status, 200);
    let first = http::next_chunk(&mut body).await.expect("message_start");
    assert!(String::from_utf8_lossy(&first).contains("message_start"));
    assert_eq!(setup.usage(&id).await.reserved_calls, 1);
    drop(body);
    // Settled well before the idle timeout (60 s) could have.
    let usage = settled(&setup, &id).await;
    assert_eq!(usage.own_calls, 1);
    assert_eq!(usage.own_tokens.unwrap().input, 10);
}

/// $2.50/M input, $10/M output, $1.25/M cached input.
const GPT_COST: u64 = 1_234 * 2_500_000 + 567 * 10_000_000 + 10_000 * 1_250_000;

fn gpt_tokens() -> TokenUsage {
    TokenUsage {
        input: 1_234,
        output: 567,
        cache_read: 10_000,
        cache_write: 0,
    }
}

fn chat(stream: bool) -> Value {
    json!({"model": "gpt-test", "stream": stream,
           "messages": [{"role": "user", "content": "hello"}]})
}

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
    let doubled = TokenUsage {
        input: 2 * gpt_tokens().input,
        output: 2 * gpt_tokens().output,
        cache_read: 2 * gpt_tokens().cache_read,
        cache_write: 0,
    };
    assert_metered(&settled(&setup, &id).await, 2, doubled, 2 * GPT_COST);
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

/// Twenty calls of one tree at once, with a budget for five: exactly five
/// reach the upstream, the rest are refused, nothing overspent.
#[tokio::test]
async fn concurrent_calls_of_a_tree_never_overspend() {
    let turns = (0..20).map(|_| Turn::text("x")).collect();
    let setup = Setup::new(turns).await;
    let (root, token) = setup
        .root(
            "alpha",
            Some(pb::Budget {
                model_calls: Some(5),
                ..Default::default()
            }),
        )
        .await;
    let mut agent = setup.server.client(Some(&token)).await;
    let mut tokens = vec![token.clone()];
    for i in 0..3 {
        let child =
            troupe_tests::create_child(&mut agent, troupe_tests::child(&format!("c{i}"))).await;
        tokens.push(setup.server.token_for(&child.session_id).await);
    }
    let calls = (0..20).map(|i| {
        let token = tokens[i % tokens.len()].clone();
        let url = setup.url("/v1/messages");
        async move {
            http::post(
                &url,
                &[("x-api-key", &token)],
                &request(MODEL, i % 2 == 0),
                LIMIT,
            )
            .await
            .status
        }
    });
    let statuses = futures::future::join_all(calls).await;
    let ok = statuses.iter().filter(|s| **s == 200).count();
    let refused = statuses.iter().filter(|s| **s == 400).count();
    assert_eq!((ok, refused), (5, 15), "{statuses:?}");
    assert_eq!(setup.upstream.requests().len(), 5);
    let usage = settled(&setup, &root).await;
    assert_eq!(usage.subtree_calls, 5, "{usage:?}");
}
