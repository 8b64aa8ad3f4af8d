//! The model gateway through the session service, on the backend
//! `TROUPE_TEST_BACKEND` names (`scripts/test` runs it again on
//! PostgreSQL), against the scripted upstream ([`troupe_tests::gateway`]):
//! a call is the token's session's and goes upstream with the provider's
//! key only; it is metered to the token and the price, streaming or not,
//! on its tree too; a call past a budget, or without a live session's
//! token, never reaches the upstream; concurrent calls never overspend.

use troupe_proto::session as pb;
use troupe_tests::{OPERATOR_TOKEN, gateway::*, http, terminate, upstream::Turn};

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

/// No token, a token that is no session's, one whose signature is not the
/// service's, the operator's, and the token of a session that has ended:
/// each refused 401 (the operator 403) in the Anthropic shape, before the
/// upstream; each refusal audited with the reason the gRPC side gives the
/// same token.
#[tokio::test]
async fn calls_without_a_live_sessions_token_never_reach_the_upstream() {
    let setup = Setup::new(vec![Turn::text("never")]).await;
    let (ended, ended_token) = setup.root("alpha", None).await;
    let (_, live_token) = setup.root("alpha", None).await;
    setup
        .server
        .operator()
        .await
        .terminate_session(terminate(ended.clone()))
        .await
        .expect("terminated");
    // A live session's token with a character of its signature changed.
    let mut forged = live_token.clone().into_bytes();
    let at = forged.len() - 10;
    forged[at] = if forged[at] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).expect("ascii");
    type Case<'a> = (&'a [(&'a str, &'a str)], u16, &'a str, &'a str);
    let cases: [Case; 7] = [
        (&[], 401, "missing credentials", "TOKEN_MISSING"),
        (
            &[("x-api-key", "")],
            401,
            "missing credentials",
            "TOKEN_MISSING",
        ),
        (
            &[("x-api-key", "not-a-token")],
            401,
            "invalid session token",
            "TOKEN_INVALID",
        ),
        (
            &[("authorization", "Bearer not-a-token")],
            401,
            "invalid session token",
            "TOKEN_INVALID",
        ),
        (
            &[("x-api-key", &forged)],
            401,
            "invalid session token",
            "TOKEN_INVALID",
        ),
        (
            &[("x-api-key", &ended_token)],
            401,
            "has ended",
            "TOKEN_REVOKED",
        ),
        (
            &[("x-api-key", OPERATOR_TOKEN)],
            403,
            "operator token",
            "SESSION_ONLY",
        ),
    ];
    for (headers, status, words, _) in cases {
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
    assert!(setup.upstream.requests().is_empty());
    let audited = refusals(&setup).await;
    let expected: Vec<(String, String)> = cases
        .iter()
        .map(|(_, _, words, reason)| ((*reason).to_owned(), (*words).to_owned()))
        .collect();
    assert_eq!(audited.len(), expected.len(), "{audited:#?}");
    for ((reason, detail), (want, words)) in audited.iter().zip(&expected) {
        assert_eq!(reason, want, "{audited:#?}");
        assert!(detail.contains(words.as_str()), "{detail}: {words}");
        assert!(!detail.contains(KEY), "{detail}");
    }
}

/// A session's token past its expiry is refused 401 before the upstream,
/// and audited `TOKEN_EXPIRED`, as the gRPC side refuses it.
#[tokio::test]
async fn an_expired_token_is_refused_and_audited_as_expired() {
    let setup = Setup::with_config(vec![Turn::text("never")], |c| c.token_ttl_secs = 1).await;
    let created = setup
        .server
        .operator()
        .await
        .create_root_session(pb::CreateRootSessionRequest {
            workspace_id: "alpha".to_owned(),
            agent_name: "worker".to_owned(),
            ..Default::default()
        })
        .await
        .expect("root")
        .into_inner();
    // Refused from the second after its expiry: wait for the clock to pass it.
    let expires = created.token_expires_at.expect("expiry").seconds + 1;
    while std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64()
        < expires as f64
    {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let answer = setup.call(&created.session_token, false).await;
    assert_eq!(answer.status, 401, "{answer:?}");
    assert!(setup.upstream.requests().is_empty());
    let audited = refusals(&setup).await;
    assert_eq!(audited.len(), 1, "{audited:#?}");
    assert_eq!(audited[0].0, "TOKEN_EXPIRED", "{audited:#?}");
}

/// The refused model calls in the audit, oldest first: reason and detail.
async fn refusals(setup: &Setup) -> Vec<(String, String)> {
    troupe_tests::audit_log(&setup.server, 1000)
        .await
        .into_iter()
        .filter(|e| e.action == "model_call" && !e.allowed)
        .map(|e| {
            assert_eq!(e.caller, "anonymous", "{e:?}");
            (e.reason, e.detail)
        })
        .collect()
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

/// `count_tokens` goes upstream with the provider's key, takes no turn and
/// costs nothing, but counts as a call; without a live session's token it
/// is refused.
#[tokio::test]
async fn count_tokens_is_forwarded_and_costs_nothing() {
    let setup = Setup::new(vec![]).await;
    let (id, token) = setup.root("alpha", None).await;
    let url = setup.url("/v1/messages/count_tokens?beta=true");
    let body =
        serde_json::json!({"model": MODEL, "messages": [{"role": "user", "content": "count me"}]});
    let answer = http::post(&url, &[("x-api-key", &token)], &body, LIMIT).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.json()["input_tokens"], body.to_string().len() / 4);
    let seen = setup.upstream.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].uri, "/v1/messages/count_tokens?beta=true");
    assert_eq!(seen[0].api_key(), Some(KEY));
    assert_metered(&setup.usage(&id).await, 1, counted_nothing(), 0);
    let answer = http::post(&url, &[("x-api-key", "nope")], &body, LIMIT).await;
    assert_eq!(answer.status, 401, "{answer:?}");
    assert_eq!(setup.upstream.requests().len(), 1);
}
