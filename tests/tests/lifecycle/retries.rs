//! Retries with one request id: one session, whether retried, raced,
//! refused or asked again after a restart.

use super::*;

#[tokio::test]
async fn retry_with_same_request_id_creates_one_session() {
    let server = TestServer::start().await;
    let (root, mut as_root, _) = server.root("alpha", TrustLevel::Direct).await;
    let request = pb::CreateSessionRequest {
        request_id: "req-1".into(),
        ..child("once")
    };
    let first = as_root
        .create_session(request.clone())
        .await
        .expect("first")
        .into_inner();
    let again = as_root
        .create_session(request.clone())
        .await
        .expect("retry")
        .into_inner();
    assert_eq!(
        first.session.as_ref().map(|s| &s.session_id),
        again.session.as_ref().map(|s| &s.session_id)
    );
    assert_eq!(first.quota, again.quota);
    // Concurrent retries too.
    let retries = join_all((0..8).map(|_| {
        let mut c = as_root.clone();
        let r = request.clone();
        async move { c.create_session(r).await }
    }))
    .await;
    assert!(retries.iter().all(|r| r.is_ok()));
    let children = server.get(&root.session_id).await.children;
    assert_eq!(children.len(), 1, "one session however often it is retried");

    let status = as_root
        .create_session(pb::CreateSessionRequest {
            title: "another payload".into(),
            ..request.clone()
        })
        .await
        .expect_err("same id, other payload");
    assert_eq!(
        (status.code(), reason(&status).as_str()),
        (Code::AlreadyExists, "IDEMPOTENCY_CONFLICT")
    );

    // Another caller's request id is its own.
    let (_, mut other, _) = server.root("alpha", TrustLevel::Direct).await;
    other
        .create_session(request)
        .await
        .expect("other caller, same id");

    // Messages.
    let target = children[0].session_id.clone();
    let send = pb::SendMessageRequest {
        session_id: target.clone(),
        message: "hi".into(),
        request_id: "m-1".into(),
    };
    let a = as_root
        .send_message(send.clone())
        .await
        .expect("send")
        .into_inner();
    let b = as_root
        .send_message(send.clone())
        .await
        .expect("resend")
        .into_inner();
    assert_eq!(
        (a.message_id.clone(), a.sequence),
        (b.message_id, b.sequence)
    );
    let status = as_root
        .send_message(pb::SendMessageRequest {
            message: "other".into(),
            ..send
        })
        .await
        .expect_err("conflict");
    assert_eq!(reason(&status), "IDEMPOTENCY_CONFLICT");
    let inbox = server.get(&target).await.inbox_count;
    assert_eq!(inbox, 2, "the initial message and one 'hi'");
    server.stop().await;
}

#[tokio::test]
async fn first_attempts_racing_with_one_request_id_make_one_session() {
    let server = TestServer::start().await;
    let (root, as_root, _) = server.root("alpha", TrustLevel::Direct).await;
    let request = pb::CreateSessionRequest {
        request_id: "race".into(),
        ..child("raced")
    };
    // No attempt has committed when they start: the lookup of the id and
    // the insert that records it must be one transaction for all to agree.
    let attempts = join_all((0..16).map(|_| {
        let mut c = as_root.clone();
        let r = request.clone();
        async move { c.create_session(r).await.map(|r| r.into_inner()) }
    }))
    .await;
    let ids: std::collections::BTreeSet<String> = attempts
        .into_iter()
        .map(|a| {
            a.expect("every attempt succeeds")
                .session
                .expect("session")
                .session_id
        })
        .collect();
    assert_eq!(
        ids.len(),
        1,
        "every attempt answers the same session: {ids:?}"
    );
    let children = server.get(&root.session_id).await.children;
    assert_eq!(children.len(), 1);

    // The execution mode is part of the payload: a callback is not an async.
    let status = as_root
        .clone()
        .create_session(pb::CreateSessionRequest {
            mode: pb::ExecutionMode::Callback as i32,
            ..request
        })
        .await
        .expect_err("same id, other mode");
    assert_eq!(reason(&status), "IDEMPOTENCY_CONFLICT");
    server.stop().await;
}

#[tokio::test]
async fn a_refused_call_with_a_request_id_records_nothing_and_holds_nothing() {
    let server = TestServer::start_with(|c| c.limits.max_children = 1).await;
    let (_, mut as_root, _) = server.root("alpha", TrustLevel::Direct).await;
    create_child(&mut as_root, child("first")).await;
    let second = pb::CreateSessionRequest {
        request_id: "second".into(),
        ..child("second")
    };
    for attempt in 0..2 {
        let status = as_root
            .create_session(second.clone())
            .await
            .expect_err("over the child quota");
        assert_eq!(
            reason(&status),
            "CHILD_QUOTA_EXCEEDED",
            "attempt {attempt} is refused by the rule, not replayed"
        );
    }
    // The refusal's transaction was rolled back: writes go on.
    let (other, _, _) = server.root("alpha", TrustLevel::Direct).await;
    as_root
        .send_message(pb::SendMessageRequest {
            request_id: "after".into(),
            ..message(other.session_id.clone(), "still writing")
        })
        .await
        .expect("a write after the refusal");
    server.stop().await;
}

#[tokio::test]
async fn a_root_create_retried_after_a_restart_is_the_same_root() {
    let mut server = TestServer::start().await;
    let request = pb::CreateRootSessionRequest {
        workspace_id: "alpha".into(),
        trust_level: TrustLevel::Sandboxed as i32,
        title: "retried".into(),
        agent_name: "worker".into(),
        initial_message: "go".into(),
        request_id: "root-1".into(),
        budget: None,
        writable_paths: Vec::new(),
    };
    let first = server
        .operator()
        .await
        .create_root_session(request.clone())
        .await
        .expect("first")
        .into_inner();
    server.restart().await;
    let again = server
        .operator()
        .await
        .create_root_session(request.clone())
        .await
        .expect("retry after the restart")
        .into_inner();
    let id = |r: &pb::CreateRootSessionResponse| r.session.as_ref().map(|s| s.session_id.clone());
    assert_eq!(id(&first), id(&again));
    let status = server
        .operator()
        .await
        .create_root_session(pb::CreateRootSessionRequest {
            trust_level: TrustLevel::Direct as i32,
            ..request
        })
        .await
        .expect_err("same id, other trust");
    assert_eq!(reason(&status), "IDEMPOTENCY_CONFLICT");
    let listed = server
        .operator()
        .await
        .list_workspace_sessions(pb::ListWorkspaceSessionsRequest {
            workspace_id: "alpha".into(),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner()
        .sessions;
    assert_eq!(listed.len(), 1, "one root however often it is retried");
    server.stop().await;
}
