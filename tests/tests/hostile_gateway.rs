//! The hostile suite of the model gateway's boundaries, on the backend
//! `TROUPE_TEST_BACKEND` names, a real HTTP client against the real
//! service and the scripted upstream: what an agent sends that must not
//! reach the provider (headers, server tools, MCP servers, remote content,
//! a key given twice), what the provider sends back that must not reach
//! the agent (its key, whole or masked, in an answer, a header or a
//! stream; its other headers; a huge error). The bytes a client sends are
//! `hostile_gateway_bytes.rs`; the spending side is
//! `hostile_gateway_spend.rs`.

use serde_json::{Value, json};
use troupe_tests::{
    gateway::*,
    http,
    upstream::{Fault, Turn},
};

/// The scripted provider allowing one beta, and the OpenAI one carrying
/// the operator's organisation and project.
fn with_provider_headers(text: String) -> String {
    text.replace(
        "    kind: anthropic\n",
        "    kind: anthropic\n    allowed_betas: [allowed-beta-1]\n",
    )
    .replace(
        "    kind: openai\n",
        "    kind: openai\n    organization: org-operator\n    project: proj-operator\n",
    )
}

/// Headers an agent may send that a provider must never see from it.
const HOSTILE_HEADERS: [(&str, &str); 12] = [
    ("anthropic-version", "2023-06-01"),
    (
        "anthropic-beta",
        "allowed-beta-1, mcp-client-2025-04-04,files-api-2025-04-14",
    ),
    ("openai-organization", "org-agent"),
    ("openai-project", "proj-agent"),
    ("x-forwarded-host", "evil.example"),
    ("x-forwarded-for", "10.9.9.9"),
    ("forwarded", "for=10.9.9.9;host=evil.example"),
    ("x-real-ip", "10.9.9.9"),
    ("cookie", "session=agent"),
    ("x-stainless-helper", "agent"),
    ("idempotency-key", "agent-chosen"),
    ("user-agent", "agent/1.0"),
];

/// Calls `/v1/messages` and `/v1/chat/completions` with every hostile
/// header, and returns the two requests the upstream got.
async fn hostile_calls(setup: &Setup) -> Vec<troupe_tests::upstream::Recorded> {
    let (_, token) = setup.root("alpha", None).await;
    let bearer = format!("Bearer {token}");
    let mut headers = vec![
        ("x-api-key", token.as_str()),
        ("accept", "application/json"),
    ];
    headers.extend(HOSTILE_HEADERS);
    let answer = http::post(
        &setup.url("/v1/messages?beta=true&x-api-key=agent"),
        &headers,
        &request(MODEL, false),
        LIMIT,
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let mut headers = vec![
        ("authorization", bearer.as_str()),
        ("accept", "application/json"),
    ];
    headers.extend(HOSTILE_HEADERS);
    let answer = http::post(
        &setup.url("/v1/chat/completions?api-version=1"),
        &headers,
        &chat(false),
        LIMIT,
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let seen = setup.upstream.requests();
    assert_eq!(seen.len(), 2);
    seen
}

fn names(seen: &troupe_tests::upstream::Recorded) -> Vec<&str> {
    let mut names: Vec<&str> = seen.headers.iter().map(|(n, _)| n.as_str()).collect();
    names.sort();
    names
}

/// Only an allowlist of the agent's headers goes upstream: `accept`, and
/// to Anthropic its API version; no forwarding, proxy or cookie header, no
/// beta the operator did not allow, no OpenAI organisation or project of
/// the agent's; and no query but Anthropic's `beta=true`.
#[tokio::test]
async fn only_allowlisted_request_headers_reach_the_provider() {
    let setup = Setup::new(vec![Turn::text("one"), Turn::text("two")]).await;
    let seen = hostile_calls(&setup).await;
    assert_eq!(seen[0].uri, "/v1/messages?beta=true");
    assert_eq!(
        names(&seen[0]),
        [
            "accept",
            "anthropic-version",
            "content-length",
            "content-type",
            "host",
            "x-api-key"
        ],
        "{:?}",
        seen[0].headers
    );
    assert_eq!(seen[0].api_key(), Some(KEY));
    assert_eq!(seen[1].uri, "/v1/chat/completions");
    assert_eq!(
        names(&seen[1]),
        [
            "accept",
            "authorization",
            "content-length",
            "content-type",
            "host"
        ],
        "{:?}",
        seen[1].headers
    );
    assert_eq!(seen[1].api_key(), Some(KEY));
}

/// The betas a provider's `allowed_betas` lists are sent on, the agent's
/// others dropped; an OpenAI provider's `organization` and `project` are
/// the operator's, whatever the agent sent.
#[tokio::test]
async fn allowed_betas_and_the_operators_organisation_are_sent() {
    let setup = Setup::edited(
        vec![Turn::text("one"), Turn::text("two")],
        with_provider_headers,
    )
    .await;
    let seen = hostile_calls(&setup).await;
    assert_eq!(seen[0].header("anthropic-beta"), Some("allowed-beta-1"));
    assert_eq!(
        names(&seen[0]),
        [
            "accept",
            "anthropic-beta",
            "anthropic-version",
            "content-length",
            "content-type",
            "host",
            "x-api-key"
        ],
    );
    assert_eq!(seen[1].header("openai-organization"), Some("org-operator"));
    assert_eq!(seen[1].header("openai-project"), Some("proj-operator"));
    assert_eq!(
        names(&seen[1]),
        [
            "accept",
            "authorization",
            "content-length",
            "content-type",
            "host",
            "openai-organization",
            "openai-project"
        ],
    );
}

/// Bodies that would make the provider act beyond answering (run its own
/// tools, call MCP servers, fetch a URL, read a file by id) are refused
/// `400 invalid_request_error` in the API's shape before the upstream;
/// a provider whose `allow` lists them takes them.
#[tokio::test]
async fn server_tools_mcp_servers_and_remote_content_are_refused_unless_allowed() {
    let messages = |content: Value| json!([{"role": "user", "content": content}]);
    let anthropic = |extra: Value| {
        let mut body = request(MODEL, false);
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let openai = |extra: Value| {
        let mut body = chat(false);
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "/v1/messages",
            anthropic(
                json!({"mcp_servers": [{"type": "url", "url": "https://mcp.example/sse", "name": "x"}]}),
            ),
            "mcp_servers",
        ),
        (
            "/v1/messages",
            anthropic(json!({"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]})),
            "server tool",
        ),
        (
            "/v1/messages",
            anthropic(json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]})),
            "server tool",
        ),
        (
            "/v1/messages",
            anthropic(
                json!({"tools": [{"name": "ok", "input_schema": {}}, {"type": "code_execution_20250825", "name": "code_execution"}]}),
            ),
            "tools[1]",
        ),
        (
            "/v1/messages",
            anthropic(
                json!({"tools": [{"type": "computer_20250124", "name": "computer", "display_width_px": 1, "display_height_px": 1}]}),
            ),
            "server tool",
        ),
        (
            "/v1/messages",
            anthropic(
                json!({"messages": messages(json!([{"type": "image", "source": {"type": "url", "url": "http://169.254.169.254/latest/meta-data/"}}]))}),
            ),
            "fetches",
        ),
        (
            "/v1/messages",
            anthropic(
                json!({"messages": messages(json!([{"type": "document", "source": {"type": "url", "url": "https://internal.example/doc.pdf"}}]))}),
            ),
            "fetches",
        ),
        (
            "/v1/messages",
            anthropic(
                json!({"messages": messages(json!([{"type": "document", "source": {"type": "file", "file_id": "file_operators"}}]))}),
            ),
            "fetches",
        ),
        (
            "/v1/chat/completions",
            openai(json!({"web_search_options": {}})),
            "web_search_options",
        ),
        (
            "/v1/chat/completions",
            openai(json!({"tools": [{"type": "web_search_preview"}]})),
            "server tool",
        ),
        (
            "/v1/chat/completions",
            openai(
                json!({"messages": messages(json!([{"type": "image_url", "image_url": {"url": "http://169.254.169.254/"}}]))}),
            ),
            "image_url",
        ),
        (
            "/v1/chat/completions",
            openai(
                json!({"messages": messages(json!([{"type": "file", "file": {"file_id": "file-operators"}}]))}),
            ),
            "file_id",
        ),
    ];
    let setup = Setup::new(vec![]).await;
    let (_, token) = setup.root("alpha", None).await;
    for (path, body, words) in &cases {
        let answer = http::post(&setup.url(path), &[("x-api-key", &token)], body, LIMIT).await;
        assert_eq!(answer.status, 400, "{body}: {answer:?}");
        let json = answer.json();
        let error = if *path == "/v1/messages" {
            assert_eq!(json["type"], "error", "{json}");
            &json["error"]
        } else {
            &json["error"]
        };
        assert_eq!(error["type"], "invalid_request_error", "{json}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(words), "{words} in {message}");
    }
    assert!(
        setup.upstream.requests().is_empty(),
        "{:#?}",
        setup.upstream.requests()
    );

    let turns = cases.iter().map(|_| Turn::text("allowed")).collect();
    let allowed = Setup::edited(turns, |text| {
        text.replace(
            "    key_file:",
            "    allow: [server_tools, mcp_servers, remote_content]\n    key_file:",
        )
    })
    .await;
    let (_, token) = allowed.root("alpha", None).await;
    for (path, body, _) in &cases {
        let answer = http::post(&allowed.url(path), &[("x-api-key", &token)], body, LIMIT).await;
        assert_eq!(answer.status, 200, "{body}: {answer:?}");
    }
    assert_eq!(allowed.upstream.requests().len(), cases.len());
}

/// A body that gives a key twice, anywhere (the gateway would check one
/// value, a provider might run the other), is refused before the upstream.
#[tokio::test]
async fn a_body_that_gives_a_key_twice_is_refused() {
    let setup = Setup::new(vec![Turn::text("never")]).await;
    let (id, token) = setup.root("alpha", None).await;
    let bodies = [
        format!(
            r#"{{"model": "{MODEL}", "max_tokens": 1, "max_tokens": 100000, "messages": [{{"role": "user", "content": "x"}}]}}"#
        ),
        format!(
            r#"{{"model": "{MODEL}", "max_tokens": 1, "messages": [{{"role": "user", "content": "x", "content": "y"}}]}}"#
        ),
        format!(
            r#"{{"model": "{MODEL}", "model": "claude-other", "max_tokens": 1, "messages": []}}"#
        ),
    ];
    for body in &bodies {
        let answer = http::send(
            hyper::Method::POST,
            &setup.url("/v1/messages"),
            &[("x-api-key", &token), ("content-type", "application/json")],
            body,
            LIMIT,
        )
        .await;
        assert_eq!(answer.status, 400, "{body}: {answer:?}");
        let json = answer.json();
        assert_eq!(json["error"]["type"], "invalid_request_error", "{json}");
        assert!(
            json["error"]["message"]
                .as_str()
                .unwrap()
                .contains("given twice"),
            "{json}"
        );
    }
    assert!(setup.upstream.requests().is_empty());
    let usage = setup.usage(&id).await;
    assert_eq!((usage.own_calls, usage.reserved_calls), (0, 0), "{usage:?}");
}

/// A provider that echoes the key it was sent, in its error's body (whole
/// and in the masked forms providers print) and in a header: the agent
/// gets the error with every form redacted, and of the headers only the
/// allowlisted ones that show nothing of the key.
#[tokio::test]
async fn the_providers_key_never_comes_back_in_an_error_or_a_header() {
    let setup = Setup::new(vec![Turn::fault(Fault::EchoKey)]).await;
    let (_, token) = setup.root("alpha", None).await;
    let answer = setup.call(&token, false).await;
    assert_eq!(answer.status, 401, "the provider's own status: {answer:?}");
    let json = answer.json();
    assert_eq!(json["error"]["type"], "authentication_error", "{json}");
    let message = json["error"]["message"].as_str().unwrap();
    assert!(message.contains("[redacted]"), "{message}");
    let head = &KEY[..8];
    let tail = &KEY[KEY.len() - 4..];
    for shown in [
        KEY,
        &format!("{head}*"),
        &format!("{head}..."),
        &format!("*{tail}"),
        &format!(".{tail}"),
    ] {
        assert!(!answer.body.contains(shown), "{shown} in {}", answer.body);
    }
    let names: Vec<&str> = answer.headers.keys().map(|n| n.as_str()).collect();
    assert_eq!(answer.headers["request-id"], "req_echo_1", "{names:?}");
    assert_eq!(answer.headers["retry-after"], "7", "{names:?}");
    for dropped in [
        "x-leak",
        "set-cookie",
        "anthropic-organization-id",
        "x-forwarded-for",
        "anthropic-ratelimit-requests-remaining",
    ] {
        assert!(
            !answer.headers.contains_key(dropped),
            "{dropped} in {names:?}"
        );
    }
    for (name, value) in &answer.headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        assert!(
            !value.contains(tail) && !value.contains(head),
            "{name}: {value}"
        );
    }
}

/// A provider whose stream says its key (as an error event would), whole
/// and masked, 1,200 times over pieces of 16 KB that cut some of them: the
/// agent reads every one redacted, and the rest of the stream whole.
#[tokio::test]
async fn the_providers_key_never_comes_back_in_a_stream() {
    let head = &KEY[..8];
    let tail = &KEY[KEY.len() - 4..];
    let echo = format!("invalid x-api-key {KEY} or {head}...{tail} ");
    let turn = Turn::deltas(&echo, 600);
    let setup = Setup::new(vec![Turn {
        fault: Some(Fault::Pace(1 << 20)),
        ..turn
    }])
    .await;
    let (id, token) = setup.root("alpha", None).await;
    let answer = setup.call(&token, true).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.body.contains("message_stop"), "{}", answer.body);
    assert!(
        answer.body.len() > 3 * (16 << 10),
        "{} bytes",
        answer.body.len()
    );
    for shown in [KEY, &format!("{head}..."), &format!("...{tail}")] {
        assert!(!answer.body.contains(shown), "{shown} in the stream");
    }
    assert_eq!(
        answer
            .body
            .matches("invalid x-api-key [redacted] or [redacted]")
            .count(),
        600
    );
    let usage = settled(&setup, &id).await;
    assert_eq!(usage.own_tokens.unwrap().output, 5, "{usage:?}");
}

/// Twenty 10 MB error answers at once: each is read no further than its
/// bound, and the agent gets the gateway's own error with the provider's
/// status, in the API's shape, never the body (nor the key it held).
#[tokio::test]
async fn a_huge_error_answer_is_not_relayed() {
    let calls = 20;
    let turns = (0..calls)
        .map(|_| Turn::fault(Fault::HugeError(10 << 20)))
        .collect();
    let setup = Setup::new(turns).await;
    let (id, token) = setup.root("alpha", None).await;
    let answers = futures::future::join_all((0..calls).map(|_| setup.call(&token, false))).await;
    for answer in answers {
        assert_eq!(
            answer.status,
            500,
            "{}",
            &answer.body[..answer.body.len().min(300)]
        );
        assert!(
            answer.body.len() < 1024,
            "{} bytes relayed",
            answer.body.len()
        );
        let json = answer.json();
        assert_eq!(json["error"]["type"], "api_error", "{json}");
        assert!(
            json["error"]["message"]
                .as_str()
                .unwrap()
                .contains("over 64 KiB"),
            "{json}"
        );
        assert!(!answer.body.contains(KEY));
    }
    let usage = settled(&setup, &id).await;
    assert_eq!(
        (usage.own_calls, usage.own_cost_pico_usd),
        (calls as u64, 0),
        "{usage:?}"
    );
}
