//! The shared HTTP endpoint: each request acts as its bearer token's
//! session, and nothing else.

use super::*;

#[tokio::test]
async fn http_endpoint_acts_as_each_requests_token() {
    let server = TestServer::start().await;
    let (alpha, _, alpha_token) = server.root("alpha", TrustLevel::Direct).await;
    let (beta, _, beta_token) = server.root("beta", TrustLevel::Sandboxed).await;
    let (a, b) = (alpha.session_id.as_str(), beta.session_id.as_str());
    let bridge = HttpBridge::start(&format!("http://{}", server.addr)).await;
    let url = bridge.url.as_str();
    let create = |title: &str| {
        call(
            "create_session",
            json!({"title": title, "agent_name": "worker", "initial_message": "go"}),
        )
    };
    let list = || call("list_workspace_sessions", json!({}));
    let mut hinted_a = bearer(&alpha_token);
    hinted_a["X-Agent-Session-Id"] = json!(a);
    let mut mismatched = bearer(&alpha_token);
    mismatched["X-Agent-Session-Id"] = json!(b);

    let out = drive(vec![
        http(url, bearer(&alpha_token), vec![create("a1"), list()]),
        http(
            url,
            bearer(&beta_token),
            vec![
                create("b1"),
                list(),
                call("get_session", json!({"session_id": a})),
            ],
        ),
        http(url, hinted_a, vec![list()]),
        http(url, mismatched, vec![create("not forwarded"), list()]),
        http(url, json!({}), vec![list()]),
        http(url, bearer("not-a-token"), vec![list()]),
    ])
    .await;

    // Each token acts as its own session, in its own workspace.
    let a1 = ok(&out[0]["results"][0]);
    assert_eq!(a1["session"]["parent_session_id"], a);
    assert_eq!(a1["session"]["workspace_id"], "alpha");
    let a1_id = a1["session"]["session_id"].as_str().unwrap();
    assert_eq!(ids(ok(&out[0]["results"][1])), sorted(&[a, a1_id]));
    let b1 = ok(&out[1]["results"][0]);
    assert_eq!(b1["session"]["parent_session_id"], b);
    assert_eq!(b1["session"]["workspace_id"], "beta");
    assert_eq!(b1["session"]["trust_level"], "sandboxed");
    let b1_id = b1["session"]["session_id"].as_str().unwrap();
    assert_eq!(ids(ok(&out[1]["results"][1])), sorted(&[b, b1_id]));
    refused(&out[1]["results"][2], "SESSION_NOT_FOUND");

    // A matching hint is accepted; a mismatched one refuses before forwarding.
    assert_eq!(ids(ok(&out[2]["results"][0])), sorted(&[a, a1_id]));
    for result in out[3]["results"].as_array().unwrap() {
        let text = refused(result, "SESSION_HINT_MISMATCH");
        assert!(text.starts_with("refused by the bridge: "), "{text}");
        assert!(text.contains("X-Agent-Session-Id"), "{text}");
        assert!(text.contains(b), "{text}");
    }
    let alpha_now = server
        .operator()
        .await
        .get_session(get(a))
        .await
        .expect("get")
        .into_inner();
    assert_eq!(
        alpha_now.children.len(),
        1,
        "the refused create was not forwarded"
    );

    // No token, or a bad one: clear refusals.
    let missing = refused(&out[4]["results"][0], "TOKEN_MISSING");
    assert!(missing.contains("Authorization: Bearer"), "{missing}");
    let invalid = refused(&out[5]["results"][0], "TOKEN_INVALID");
    assert!(
        invalid.starts_with("refused by the session service: "),
        "{invalid}"
    );
    assert_eq!(
        out[5]["results"][0]["structuredContent"]["error"]["code"],
        "UNAUTHENTICATED"
    );
    bridge.stop().await;
}
