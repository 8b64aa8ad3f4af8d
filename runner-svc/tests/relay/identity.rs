//! The relay passes the caller's identity and adds none.

use super::*;

/// The relay adds no identity: a call through it is its token's session's
/// (the audit's caller), and a forged or absent token is refused by the
/// service, from the host's side of the socket and from an agent in the
/// container alike.
#[tokio::test]
async fn the_relay_passes_the_callers_identity_and_adds_none() {
    require_agent_tools();
    let pair = Pair::relayed(live, |_| {}).await;
    let ws = pair.runner.workspace("relay-identity");
    pair.agent(&ws, "holder", "sleep 1000");
    let root = pair.running_root(&ws, "holder", "hold").await;
    let socket = pair.relay_socket();

    let token = pair.server.token_for(&root.session_id).await;
    let mut as_root = through(&socket, Some(&token)).await;
    let child = as_root
        .create_session(CreateSessionRequest {
            title: "relayed".into(),
            agent_name: "holder".into(),
            initial_message: "hold".into(),
            mode: ExecutionMode::Async as i32,
            ..Default::default()
        })
        .await
        .expect("a create through the relay")
        .into_inner()
        .session
        .unwrap();
    assert_eq!(child.parent_session_id, root.session_id);
    let created = creation_of(&pair, &root.session_id, &child.session_id).await;
    assert_eq!(created.caller, format!("session:{}", root.session_id));

    // A token whose signature was changed, and no token at all.
    let (unsigned, signature) = token.rsplit_once('.').unwrap();
    let flipped = if signature.starts_with('A') { 'B' } else { 'A' };
    let forged = format!("{unsigned}.{flipped}{}", &signature[1..]);
    for (what, token) in [("forged", Some(forged.as_str())), ("absent", None)] {
        let mut client = through(&socket, token).await;
        let refused = client
            .get_session(troupe_tests::get(&root.session_id))
            .await
            .expect_err(what);
        assert_eq!(refused.code(), Code::Unauthenticated, "{what}: {refused:?}");
        let refused = client
            .create_root_session(pb::CreateRootSessionRequest {
                workspace_id: ws.clone(),
                agent_name: "holder".into(),
                initial_message: "x".into(),
                ..Default::default()
            })
            .await
            .expect_err(what);
        assert_eq!(refused.code(), Code::Unauthenticated, "{what}: {refused:?}");
    }

    // An agent in the container with a forged token gets nowhere either.
    pair.agent_command(
        &ws,
        "forger",
        &[
            "env",
            &format!("TROUPE_SESSION_TOKEN={forged}"),
            "troupe-demo-agent",
        ],
    );
    let forger = pair
        .root(
            &ws,
            "forger",
            &serde_json::json!({"list": true}).to_string(),
        )
        .await;
    let out = pair.completed_events(&forger.session_id).await;
    assert!(
        out.iter()
            .any(|e| e["event"] == "refused" && e["reason"] == "TOKEN_INVALID"),
        "{out:?}"
    );
    assert!(!out.iter().any(|e| e["event"] == "listed"), "{out:?}");
}
