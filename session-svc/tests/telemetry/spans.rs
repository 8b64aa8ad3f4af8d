//! What a spawn's span says: the session it made, or the refusal, for a
//! caller with a token and one without.

use super::*;

/// A spawn's span names the session it made (Troupe's attributes and the
/// GenAI agent conventions), and a refused spawn's span names the reason.
#[tokio::test(flavor = "multi_thread")]
async fn spawn_spans_carry_the_session_and_the_refusal() {
    let (receiver, endpoint) = Receiver::start().await;
    let service = exporting(&endpoint, &["--max-depth", "0"]);
    let root = service.create_root().await;
    assert_eq!(
        service.spawn(&root).await.unwrap_err().code(),
        tonic::Code::ResourceExhausted
    );
    assert!(service.stop().await);

    let spans = receiver.spans();
    let created = named(&spans, "create_root");
    assert_eq!(created.get("troupe.session.id"), root);
    assert_eq!(created.get("gen_ai.agent.id"), root);
    assert_eq!(created.get("gen_ai.agent.name"), "worker");
    assert_eq!(created.get("gen_ai.operation.name"), "create_agent");
    assert_eq!(created.get("troupe.workspace.id"), "alpha");
    assert_eq!(created.get("troupe.trust_level"), "direct");
    assert_eq!(created.get("troupe.depth"), "0");
    assert!(created.get("troupe.tree.id").starts_with("tree_"));

    let refused = named(&spans, "spawn");
    assert_eq!(refused.get("troupe.refusal.reason"), "DEPTH_EXCEEDED");
    assert_eq!(refused.get("troupe.session.id"), "");
}

/// A caller without a valid token never gets as far as a spawn: its
/// spawn span carries the refusal and no session, for a root or a child,
/// and is not in the tree's trace it named.
#[tokio::test(flavor = "multi_thread")]
async fn an_unauthenticated_spawn_is_refused_in_its_span() {
    let (receiver, endpoint) = Receiver::start().await;
    let service = exporting(&endpoint, &[]);
    let root = service.create_root().await;
    let mut stranger = service.client("not-a-token").await;
    let refused = stranger
        .create_root_session(CreateRootSessionRequest {
            workspace_id: "alpha".into(),
            trust_level: TrustLevel::Direct as i32,
            agent_name: "worker".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let refused = stranger
        .create_session(CreateSessionRequest {
            parent_session_id: root.clone(),
            agent_name: "worker".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    assert!(service.stop().await);

    let spans = receiver.spans();
    let spawns: Vec<_> = spans
        .iter()
        .filter(|s| matches!(s.name.as_str(), "spawn" | "create_root"))
        .collect();
    assert_eq!(spawns.len(), 3, "{spawns:#?}");
    let made = named(&spans, "create_root");
    assert_eq!(made.get("troupe.session.id"), root);
    let refused: Vec<_> = spawns
        .iter()
        .filter(|s| s.get("troupe.session.id").is_empty())
        .collect();
    assert_eq!(refused.len(), 2, "{spawns:#?}");
    for span in refused {
        assert_eq!(span.get("troupe.refusal.reason"), "TOKEN_INVALID");
        assert_ne!(span.trace, made.trace, "a stranger joins no tree");
    }
}
