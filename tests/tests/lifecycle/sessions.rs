//! Messages in order, terminations and their races with spawning, agent
//! definitions' lookup, and ids the caller may not see.

use super::*;

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
