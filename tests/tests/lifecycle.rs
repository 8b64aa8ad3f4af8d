//! Idempotent retries, messages and inboxes, cascade termination and its
//! race with spawning, agent definitions, and ids the caller may not see.

use futures::future::join_all;
use tonic::Code;
use troupe_proto::session::{self as pb, SessionStatus, TrustLevel};
use troupe_tests::{TestServer, child, create_child, get, message, reason, terminate};

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

#[tokio::test]
async fn messages_queue_in_order_and_ended_sessions_refuse_them() {
    let server = TestServer::start().await;
    let (_, mut a, _) = server.root("alpha", TrustLevel::Direct).await;
    let (b, _, _) = server.root("alpha", TrustLevel::Direct).await;
    let mut seqs = Vec::new();
    for i in 0..3 {
        let sent = a
            .send_message(pb::SendMessageRequest {
                session_id: b.session_id.clone(),
                message: format!("m{i}"),
                request_id: String::new(),
            })
            .await
            .expect("send")
            .into_inner();
        assert_eq!(sent.delivery, pb::DeliveryStatus::Queued as i32);
        seqs.push(sent.sequence);
    }
    assert_eq!(seqs, [2, 3, 4], "after the initial message");
    let status = a
        .send_message(message(b.session_id.clone(), String::new()))
        .await
        .expect_err("empty");
    assert_eq!(status.code(), Code::InvalidArgument);
    server
        .operator()
        .await
        .terminate_session(pb::TerminateSessionRequest {
            session_id: b.session_id.clone(),
            reason: "done".into(),
        })
        .await
        .expect("terminate");
    let status = a
        .send_message(message(b.session_id, "late"))
        .await
        .expect_err("ended");
    assert_eq!(
        (status.code(), reason(&status).as_str()),
        (Code::FailedPrecondition, "SESSION_ENDED")
    );
    server.stop().await;
}

#[tokio::test]
async fn terminate_ends_the_subtree_and_agents_only_their_descendants() {
    let server = TestServer::start().await;
    let (root, mut as_root, _) = server.root("alpha", TrustLevel::Direct).await;
    let a = create_child(&mut as_root, child("a")).await;
    let b = create_child(&mut as_root, child("b")).await;
    let mut as_a = server.act_as(&a.session_id).await;
    let a1 = create_child(&mut as_a, child("a1")).await;

    // Not its own descendant: a sibling, its parent, itself.
    for target in [&b.session_id, &root.session_id, &a.session_id] {
        let status = as_a
            .terminate_session(terminate(target.clone()))
            .await
            .expect_err("not a descendant");
        assert_eq!(
            (status.code(), reason(&status).as_str()),
            (Code::PermissionDenied, "NOT_A_DESCENDANT")
        );
    }
    // The root ends a's subtree.
    let ended = as_root
        .terminate_session(terminate(a.session_id.clone()))
        .await
        .expect("terminate a")
        .into_inner();
    assert_eq!(
        ended.terminated_session_ids,
        [a.session_id.clone(), a1.session_id.clone()]
    );
    let mut op = server.operator().await;
    let get = |id: String| {
        let mut op = op.clone();
        async move {
            op.get_session(get(id))
                .await
                .expect("get")
                .into_inner()
                .session
                .expect("s")
        }
    };
    let a1_now = get(a1.session_id.clone()).await;
    assert_eq!(a1_now.status, SessionStatus::Terminated as i32);
    assert_eq!(a1_now.end_reason, "cascade");
    assert!(a1_now.ended_at.is_some());
    assert_eq!(get(a.session_id.clone()).await.end_reason, "manual");
    assert_eq!(
        get(b.session_id.clone()).await.status,
        SessionStatus::Pending as i32
    );
    // The operator ends the rest; terminating again ends nothing more.
    let rest = op
        .terminate_session(terminate(root.session_id.clone()))
        .await
        .expect("terminate root")
        .into_inner();
    assert_eq!(
        rest.terminated_session_ids,
        [root.session_id.clone(), b.session_id.clone()]
    );
    let again = op
        .terminate_session(terminate(root.session_id))
        .await
        .expect("idempotent")
        .into_inner();
    assert!(again.terminated_session_ids.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn no_child_survives_a_termination_it_races_with() {
    let server = TestServer::start_with(|c| {
        c.limits.max_children = 1000;
        c.limits.max_tree_sessions = 1000;
        c.limits.max_active_per_workspace = 10_000;
    })
    .await;
    for round in 0..5 {
        let (root, as_root, _) = server.root("alpha", TrustLevel::Direct).await;
        let spawns = join_all((0..12).map(|i| {
            let mut c = as_root.clone();
            async move { c.create_session(child(&format!("r{round}-{i}"))).await }
        }));
        let mut op = server.operator().await;
        let kill = op.terminate_session(terminate(root.session_id.clone()));
        let (results, killed) = tokio::join!(spawns, kill);
        killed.expect("terminate");
        for result in results {
            if let Err(status) = result {
                assert!(
                    matches!(
                        reason(&status).as_str(),
                        "TOKEN_REVOKED" | "PARENT_NOT_RUNNING"
                    ),
                    "{status:?}"
                );
            }
        }
        let children = op
            .get_session(get(root.session_id.clone()))
            .await
            .expect("get")
            .into_inner()
            .children;
        assert!(
            children
                .iter()
                .all(|c| c.status == SessionStatus::Terminated as i32),
            "round {round}: a child outlived its terminated parent: {children:?}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn agent_definitions_resolve_workspace_first_and_names_are_slugs() {
    let server = TestServer::start().await;
    server.write_agent_text(
        None,
        "lead",
        "---\nname: lead\ncommand: [\"/shared/lead\"]\n---\n",
    );
    server.write_agent_text(
        Some("alpha"),
        "lead",
        "---\nname: lead\ncommand: [\"/alpha/lead\"]\n---\n",
    );
    let op = server.operator().await;
    let create = |ws: &str, agent: &str| {
        let mut op = op.clone();
        let req = pb::CreateRootSessionRequest {
            workspace_id: ws.into(),
            agent_name: agent.into(),
            ..Default::default()
        };
        async move { op.create_root_session(req).await }
    };
    create("alpha", "lead").await.expect("workspace agent");
    create("beta", "lead").await.expect("shared agent");
    let status = create("alpha", "ghost").await.expect_err("unknown agent");
    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(status.message(), "agent not found: ghost");
    assert_eq!(reason(&status), "AGENT_NOT_FOUND");
    for (ws, agent) in [
        ("../x", "lead"),
        ("alpha", "../lead"),
        ("alpha", "Agents/lead"),
        ("", "lead"),
        ("alpha", ""),
    ] {
        let status = create(ws, agent).await.expect_err("not a slug");
        assert_eq!(status.code(), Code::InvalidArgument, "{ws:?} {agent:?}");
    }
    server.write_agent_text(None, "broken", "---\nname: broken\n---\nno command\n");
    let status = create("alpha", "broken")
        .await
        .expect_err("invalid definition");
    assert_eq!(
        (status.code(), reason(&status).as_str()),
        (Code::FailedPrecondition, "AGENT_INVALID")
    );
    server.stop().await;
}

#[tokio::test]
async fn invisible_and_nonexistent_ids_answer_the_same() {
    let server = TestServer::start().await;
    let (_, mut sandboxed, _) = server.root("alpha", TrustLevel::Sandboxed).await;
    let (direct, _, _) = server.root("alpha", TrustLevel::Direct).await;
    let (elsewhere, _, _) = server.root("beta", TrustLevel::Sandboxed).await;
    let missing = "sess_00000000000000000000000000000000".to_owned();

    let shape = |status: tonic::Status, id: &str| {
        (
            status.code(),
            status.message().replace(id, "ID"),
            reason(&status),
        )
    };
    let mut answers = Vec::new();
    for id in [&direct.session_id, &elsewhere.session_id, &missing] {
        let get = sandboxed
            .get_session(get(id.clone()))
            .await
            .expect_err("get");
        let send = sandboxed
            .send_message(message(id.clone(), "x"))
            .await
            .expect_err("send");
        let term = sandboxed
            .terminate_session(terminate(id.clone()))
            .await
            .expect_err("terminate");
        let watch = sandboxed
            .watch_sessions(pb::WatchSessionsRequest {
                session_id: id.clone(),
                ..Default::default()
            })
            .await
            .expect_err("watch");
        answers.push([
            shape(get, id),
            shape(send, id),
            shape(term, id),
            shape(watch, id),
        ]);
    }
    assert_eq!(answers[0], answers[2], "direct session vs nonexistent");
    assert_eq!(answers[1], answers[2], "other workspace vs nonexistent");
    assert_eq!(answers[2][0].0, Code::NotFound);
    server.stop().await;
}
