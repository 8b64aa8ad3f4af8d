//! Every spawn refusal, and the atomicity of the quotas under concurrent spawns.

use std::time::Duration;

use futures::future::join_all;
use tonic::Code;
use troupe_proto::session::{self as pb, SessionStatus, TrustLevel};
use troupe_session_svc::Limits;
use troupe_tests::{TestServer, child, create_child, error_metadata, reason, terminate};

async fn spawn(
    client: &mut troupe_tests::Client,
    title: &str,
) -> Result<pb::CreateSessionResponse, tonic::Status> {
    client
        .create_session(child(title))
        .await
        .map(|r| r.into_inner())
}

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
    let sandboxed = |title: &str| pb::CreateSessionRequest {
        trust_level: TrustLevel::Sandboxed as i32,
        ..child(title)
    };
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
    let sandboxed = |title: &str| pb::CreateSessionRequest {
        trust_level: TrustLevel::Sandboxed as i32,
        ..child(title)
    };
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
        .create_session(pb::CreateSessionRequest {
            parent_session_id: kid.session_id.clone(),
            ..child("orphan")
        })
        .await
        .expect_err("parent ended");
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(reason(&status), "PARENT_NOT_RUNNING");
    // The operator acting for a live session gets every rule as that session would.
    let made = create_child(
        &mut op,
        pb::CreateSessionRequest {
            parent_session_id: root.session_id.clone(),
            ..child("on behalf")
        },
    )
    .await;
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
    let for_session = |parent: &str, title: &str| pb::CreateSessionRequest {
        parent_session_id: parent.to_owned(),
        ..child(title)
    };

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

/// Fires `n` spawns at once through separate connections and counts successes.
async fn race(server: &TestServer, parent: &str, n: usize) -> (usize, Vec<String>) {
    let mut clients = Vec::new();
    for _ in 0..n {
        clients.push(server.act_as(parent).await);
    }
    let results = join_all(
        clients
            .into_iter()
            .enumerate()
            .map(|(i, mut c)| async move { c.create_session(child(&format!("racer {i}"))).await }),
    )
    .await;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let reasons = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(reason))
        .collect();
    (ok, reasons)
}

#[tokio::test]
async fn concurrent_spawns_at_limit_minus_one_give_exactly_one_success() {
    // Tree quota: the tree holds 9 of 10 after eight children of the root... built with depth room.
    let server = TestServer::start_with(|c| {
        c.limits.max_tree_sessions = 10;
        c.limits.max_children = 100;
    })
    .await;
    let (root, mut as_root, _) = server.root("alpha", TrustLevel::Direct).await;
    for i in 0..8 {
        spawn(&mut as_root, &format!("fill {i}"))
            .await
            .expect("fill");
    }
    let (ok, reasons) = race(&server, &root.session_id, 16).await;
    assert_eq!(ok, 1, "tree quota race: {reasons:?}");
    assert!(
        reasons.iter().all(|r| r == "TREE_QUOTA_EXCEEDED"),
        "{reasons:?}"
    );

    // Child quota.
    let server = TestServer::start_with(|c| {
        c.limits.max_tree_sessions = 100;
        c.limits.max_children = 5;
    })
    .await;
    let (root, mut as_root, _) = server.root("alpha", TrustLevel::Direct).await;
    for i in 0..4 {
        spawn(&mut as_root, &format!("fill {i}"))
            .await
            .expect("fill");
    }
    let (ok, reasons) = race(&server, &root.session_id, 16).await;
    assert_eq!(ok, 1, "child quota race: {reasons:?}");
    assert!(
        reasons.iter().all(|r| r == "CHILD_QUOTA_EXCEEDED"),
        "{reasons:?}"
    );

    let children = server.get(&root.session_id).await.children;
    assert_eq!(children.len(), 5);
    assert!(
        children
            .iter()
            .all(|c| c.status == SessionStatus::Pending as i32)
    );
}

/// A SQLite database has one owner: a second service (or store) on it is refused
/// while the first runs, so no check can pass on a stale view, and the
/// database is free again once the first stops.
#[tokio::test]
async fn a_second_service_on_the_same_database_is_refused() {
    use troupe_session_svc::store::SqliteStore;
    use troupe_tests::postgres::Backend;
    if Backend::from_env() != Backend::Sqlite {
        // Replicas on one PostgreSQL database are the design there.
        eprintln!("SQLite only: one service owns a SQLite file");
        return;
    }
    let mut server = TestServer::start().await;
    server.root("alpha", TrustLevel::Direct).await;
    let url = server.config.database_url();
    let err = SqliteStore::open(&url).await.expect_err("second owner");
    assert!(
        err.to_string()
            .contains("in use by another session service"),
        "{err}"
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let second = troupe_session_svc::serve(server.config.clone(), listener, async {}).await;
    let err = format!("{:#}", second.expect_err("second service"));
    assert!(err.contains("in use by another session service"), "{err}");
    server.stop_for_restart().await;
    drop(
        SqliteStore::open(&url)
            .await
            .expect("free after the first stops"),
    );
    server.start_again().await;
    server.stop().await;
}
