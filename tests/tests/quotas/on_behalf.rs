//! An operator naming a parent acts on that session's behalf: the parent
//! must be running, and every rule of the session applies.

use super::*;

/// The operator's request for a child of `parent`, on its behalf.
fn for_session(parent: &str, title: &str) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        parent_session_id: parent.to_owned(),
        ..child(title)
    }
}

#[tokio::test]
async fn a_parent_that_ended_cannot_create_children() {
    let server = TestServer::start().await;
    let (root, mut as_root, _) = server.root("alpha", TrustLevel::Direct).await;
    let kid = spawn(&mut as_root, "kid")
        .await
        .expect("kid")
        .session
        .expect("s");
    let mut op = server.operator().await;
    op.terminate_session(terminate(kid.session_id.clone()))
        .await
        .expect("terminate kid");
    // The operator acting on the ended session's behalf gets the rule's refusal.
    let status = op
        .create_session(for_session(&kid.session_id, "orphan"))
        .await
        .expect_err("parent ended");
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(reason(&status), "PARENT_NOT_RUNNING");
    // The operator acting for a live session gets every rule as that session would.
    let made = create_child(&mut op, for_session(&root.session_id, "on behalf")).await;
    assert_eq!(made.parent_session_id, root.session_id);
    assert_eq!(made.created_by, "operator");
    server.stop().await;
}

/// An operator naming a parent acts on that session's behalf: every rule of
/// the session applies, none of the operator's reach does.
#[tokio::test]
async fn an_operator_acting_for_a_session_meets_that_sessions_rules() {
    let server = TestServer::start_with(|c| {
        c.limits.max_depth = 1;
        c.limits.max_children = 3;
        c.limits.spawn_rate_per_sec = 1.0;
        c.limits.spawn_burst = 2;
    })
    .await;
    let mut op = server.operator().await;
    let (sandboxed, _, _) = server.root("alpha", TrustLevel::Sandboxed).await;

    // Trust: a sandboxed session's child cannot be direct, whoever asks.
    let status = op
        .create_session(pb::CreateSessionRequest {
            trust_level: TrustLevel::Direct as i32,
            ..for_session(&sandboxed.session_id, "escalated")
        })
        .await
        .expect_err("no escalation on a session's behalf");
    assert_eq!(reason(&status), "TRUST_ESCALATION");
    let inherited = create_child(&mut op, for_session(&sandboxed.session_id, "inherits")).await;
    assert_eq!(inherited.trust_level, TrustLevel::Sandboxed as i32);

    // Depth: the child is at the limit, so it may not have children.
    let status = op
        .create_session(for_session(&inherited.session_id, "too deep"))
        .await
        .expect_err("depth");
    assert_eq!(reason(&status), "DEPTH_EXCEEDED");

    // Rate, then children: the session's own budgets, spent by the operator.
    create_child(&mut op, for_session(&sandboxed.session_id, "second")).await;
    let status = op
        .create_session(for_session(&sandboxed.session_id, "third"))
        .await
        .expect_err("over the rate");
    assert_eq!(reason(&status), "RATE_LIMITED");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    create_child(&mut op, for_session(&sandboxed.session_id, "third")).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let status = op
        .create_session(for_session(&sandboxed.session_id, "fourth"))
        .await
        .expect_err("over the child quota");
    assert_eq!(reason(&status), "CHILD_QUOTA_EXCEEDED");
    server.stop().await;
}
