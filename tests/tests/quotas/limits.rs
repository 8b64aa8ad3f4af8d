//! Each limit refuses a spawn with its reason and reports what is left:
//! depth, the tree, a session's children, the workspace's active sessions,
//! and the spawn rate.

use super::*;

#[tokio::test]
async fn depth_limit_refuses_with_its_reason_and_reports_quota() {
    let server = TestServer::start().await; // max depth 2
    let (_, mut root, _) = server.root("alpha", TrustLevel::Direct).await;
    let first = spawn(&mut root, "depth 1").await.expect("depth 1");
    let quota = first.quota.expect("quota");
    assert_eq!(quota.depth_remaining, 1);
    assert_eq!(quota.tree_sessions_remaining, 8);
    let d1 = first.session.expect("session");
    assert_eq!(d1.depth, 1);
    let mut as_d1 = server.act_as(&d1.session_id).await;
    let second = spawn(&mut as_d1, "depth 2").await.expect("depth 2");
    assert_eq!(second.quota.expect("quota").depth_remaining, 0);
    let d2 = second.session.expect("session");
    assert_eq!((d2.depth, d2.tree_id.clone()), (2, d1.tree_id.clone()));
    let mut as_d2 = server.act_as(&d2.session_id).await;
    let status = spawn(&mut as_d2, "depth 3").await.expect_err("too deep");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(reason(&status), "DEPTH_EXCEEDED");
    assert_eq!(
        error_metadata(&status, "depth_remaining").as_deref(),
        Some("0")
    );
    assert!(status.message().contains("depth"), "{}", status.message());
    server.stop().await;
}

#[tokio::test]
async fn tree_child_and_workspace_quotas_refuse_with_their_reasons() {
    let server = TestServer::start_with(|c| {
        c.limits = Limits {
            max_tree_sessions: 4,
            max_children: 2,
            max_active_per_workspace: 6,
            spawn_rate_per_sec: 0.0,
            ..Limits::default()
        }
    })
    .await;
    let (_, mut root, _) = server.root("alpha", TrustLevel::Direct).await;
    let a = spawn(&mut root, "a").await.expect("a").session.expect("s");
    spawn(&mut root, "b").await.expect("b");
    let status = spawn(&mut root, "c").await.expect_err("third child");
    assert_eq!(reason(&status), "CHILD_QUOTA_EXCEEDED");
    assert_eq!(
        error_metadata(&status, "children_remaining").as_deref(),
        Some("0")
    );

    let mut as_a = server.act_as(&a.session_id).await;
    let last = spawn(&mut as_a, "a1").await.expect("fourth in tree");
    assert_eq!(last.quota.expect("quota").tree_sessions_remaining, 0);
    let status = spawn(&mut as_a, "a2").await.expect_err("fifth in tree");
    assert_eq!(reason(&status), "TREE_QUOTA_EXCEEDED");

    // Two more roots bring the workspace to 6 active sessions.
    server.root("alpha", TrustLevel::Direct).await;
    let (_, mut other, _) = server.root("alpha", TrustLevel::Direct).await;
    let status = spawn(&mut other, "x").await.expect_err("workspace full");
    assert_eq!(reason(&status), "WORKSPACE_QUOTA_EXCEEDED");
    let status = server
        .operator()
        .await
        .create_root_session(pb::CreateRootSessionRequest {
            workspace_id: "alpha".into(),
            agent_name: "worker".into(),
            ..Default::default()
        })
        .await
        .expect_err("no room for a root either");
    assert_eq!(reason(&status), "WORKSPACE_QUOTA_EXCEEDED");
    // Another workspace is unaffected.
    server.root("beta", TrustLevel::Direct).await;
    server.stop().await;
}

#[tokio::test]
async fn spawn_rate_is_limited_per_session_with_retry_info() {
    let server = TestServer::start_with(|c| {
        c.limits.spawn_rate_per_sec = 1.0;
        c.limits.spawn_burst = 2;
    })
    .await;
    let (_, mut root, _) = server.root("alpha", TrustLevel::Direct).await;
    spawn(&mut root, "1").await.expect("burst 1");
    spawn(&mut root, "2").await.expect("burst 2");
    let status = spawn(&mut root, "3").await.expect_err("over the rate");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(reason(&status), "RATE_LIMITED");
    let wait: u64 = error_metadata(&status, "retry_after_ms")
        .expect("retry_after_ms")
        .parse()
        .expect("number");
    assert!(wait > 0 && wait <= 1000, "wait {wait}");
    // Another session's budget is its own.
    let (_, mut other, _) = server.root("alpha", TrustLevel::Direct).await;
    spawn(&mut other, "other").await.expect("other session");
    tokio::time::sleep(Duration::from_millis(wait + 20)).await;
    spawn(&mut root, "after wait").await.expect("after waiting");
    server.stop().await;
}
