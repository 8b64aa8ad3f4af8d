//! The bodies an agent sends: none that would make the provider act beyond
//! answering (server tools, MCP servers, remote content) unless the operator
//! allows it, and none that gives a key twice.

use super::*;

/// `body` with the fields of `extra` set.
fn with(mut body: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Bodies that would make the provider act beyond answering (run its own
/// tools, call MCP servers, fetch a URL, read a file by id) are refused
/// `400 invalid_request_error` in the API's shape before the upstream;
/// a provider whose `allow` lists them takes them.
#[tokio::test]
async fn server_tools_mcp_servers_and_remote_content_are_refused_unless_allowed() {
    let messages = |content: Value| json!([{"role": "user", "content": content}]);
    let anthropic = |extra: Value| with(request(MODEL, false), extra);
    let openai = |extra: Value| with(chat(false), extra);
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

/// A Responses body that hides a server tool deep in namespaces of
/// namespaces, nests past JSON's bound, or gives its output bound twice
/// (checked on one, run on the other) is refused before the upstream, and
/// nothing is charged.
#[tokio::test]
async fn a_responses_body_that_hides_a_server_tool_or_gives_its_bound_twice_is_refused() {
    let setup = Setup::new(vec![Turn::text("never")]).await;
    let (id, token) = setup.root("alpha", None).await;
    let nested = |depth: usize| {
        let mut tool = r#"{"type": "web_search"}"#.to_owned();
        for _ in 0..depth {
            tool = format!(r#"{{"type": "namespace", "name": "n", "tools": [{tool}]}}"#);
        }
        format!(r#"{{"model": "gpt-test", "input": "x", "tools": [{tool}]}}"#)
    };
    let bodies = [
        (nested(40), "a server tool"),
        (nested(200), "not JSON"),
        (
            r#"{"model": "gpt-test", "max_output_tokens": 1, "max_output_tokens": 100000, "input": "x"}"#.to_owned(),
            "given twice",
        ),
    ];
    for (body, words) in &bodies {
        let answer = http::send(
            hyper::Method::POST,
            &setup.url("/v1/responses"),
            &[
                ("authorization", &format!("Bearer {token}")),
                ("content-type", "application/json"),
            ],
            body,
            LIMIT,
        )
        .await;
        assert_eq!(answer.status, 400, "{words}: {answer:?}");
        let json = answer.json();
        assert_eq!(json["error"]["type"], "invalid_request_error", "{json}");
        let message = json["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{words}: {message}");
    }
    assert!(setup.upstream.requests().is_empty());
    let usage = setup.usage(&id).await;
    assert_eq!((usage.own_calls, usage.reserved_calls), (0, 0), "{usage:?}");
}
