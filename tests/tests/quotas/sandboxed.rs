//! A sandboxed spawner is told only what it may see: what is left of its
//! tree, and its refusals, count no direct session.

use super::*;

/// A sandboxed child's request.
fn sandboxed(title: &str) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        trust_level: TrustLevel::Sandboxed as i32,
        ..child(title)
    }
}

/// What a sandboxed spawner is told is left of its tree counts only the
/// sessions it may see: direct sessions of its tree change nothing of it.
#[tokio::test]
async fn a_sandboxed_spawners_quota_left_counts_only_what_it_sees() {
    let server = TestServer::start_with(|c| {
        c.limits = Limits {
            max_tree_sessions: 6,
            spawn_rate_per_sec: 0.0,
            ..Limits::default()
        }
    })
    .await;
    let mut told = Vec::new();
    for directs in [0, 2] {
        let (_, mut root, _) = server.root("alpha", TrustLevel::Direct).await;
        let kid = create_child(&mut root, sandboxed("kid")).await;
        for n in 0..directs {
            spawn(&mut root, &format!("direct {n}"))
                .await
                .expect("a direct sibling");
        }
        let quota = server
            .act_as(&kid.session_id)
            .await
            .create_session(sandboxed("grandchild"))
            .await
            .expect("room in the tree")
            .into_inner()
            .quota
            .expect("quota");
        told.push(quota.tree_sessions_remaining);
    }
    // Six, less the kid and its child: the direct root and siblings unseen.
    assert_eq!(told, vec![4, 4]);
    server.stop().await;
}

/// A sandboxed spawner's quota refusals name the limit, never a count of
/// sessions it may not see: its tree and its workspace hold direct ones.
#[tokio::test]
async fn a_sandboxed_spawners_refusals_count_nothing_it_cannot_see() {
    let server = TestServer::start_with(|c| {
        c.limits = Limits {
            max_tree_sessions: 3,
            max_active_per_workspace: 5,
            spawn_rate_per_sec: 0.0,
            ..Limits::default()
        }
    })
    .await;
    let (_, mut root, _) = server.root("alpha", TrustLevel::Direct).await;
    let kid = root
        .create_session(sandboxed("kid"))
        .await
        .expect("kid")
        .into_inner()
        .session
        .expect("session");
    spawn(&mut root, "direct sibling")
        .await
        .expect("third in tree");
    let mut as_kid = server.act_as(&kid.session_id).await;
    let status = as_kid
        .create_session(sandboxed("fourth"))
        .await
        .expect_err("the tree is full");
    assert_eq!(reason(&status), "TREE_QUOTA_EXCEEDED");
    assert!(
        status.message().contains("its most sessions (3)"),
        "{status:?}"
    );
    assert!(!status.message().contains("3 of 3"), "{status:?}");

    // The workspace: three direct roots more (five active); the sandboxed
    // root's spawn is refused without the count.
    server.root("alpha", TrustLevel::Direct).await;
    let (_, mut lone, _) = server.root("alpha", TrustLevel::Sandboxed).await;
    let status = lone
        .create_session(sandboxed("one more"))
        .await
        .expect_err("the workspace is full");
    assert_eq!(reason(&status), "WORKSPACE_QUOTA_EXCEEDED");
    assert!(
        status.message().contains("its most active sessions (5)"),
        "{status:?}"
    );
    assert!(!status.message().contains("5 of 5"), "{status:?}");
    // A direct spawner is told the count.
    let status = spawn(&mut root, "direct").await.expect_err("full");
    assert!(
        status.message().contains("of 5 sessions are active")
            || status.message().contains("of 3 sessions"),
        "{status:?}"
    );
    server.stop().await;
}
