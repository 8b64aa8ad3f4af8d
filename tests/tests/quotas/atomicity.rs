//! The quotas under concurrent spawns: exactly one of many racing spawns
//! at a limit succeeds; a SQLite database has one owner, so no check passes
//! on a stale view.

use super::*;

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
