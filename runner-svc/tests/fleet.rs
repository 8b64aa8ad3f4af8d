//! Several runners: two real `troupe-runner` processes, each with its own
//! data directory, address, uid range and container prefix on the one
//! Docker engine, registered (`--register`) with a real session service.
//! Workspaces are placed by room and stay on their runner; a runner killed
//! (SIGKILL) mid-tree has its sessions end `runner_lost` within its lease
//! plus a margin, the CALLBACK parent is told, a new session of the
//! workspace runs on the other runner, and what the killed runner still
//! runs is stopped once it registers again.

use crate::common;

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use common::{
    MINUTE,
    pair::require_agent_tools,
    runners::{Containers, RunnerProcess, TTL_MS, workspace},
};
use troupe_proto::session::{
    self as pb, CreateSessionRequest, ExecutionMode, ListAuditRequest, SessionStatus,
};
use troupe_tests::TestServer;

/// A session service with the agent `idle` (prints `up`, then echoes its
/// stdin until it closes), and the socket its agents reach it by.
async fn service() -> (TestServer, PathBuf, tempfile::TempDir) {
    common::require_engine();
    require_agent_tools();
    let sockets = tempfile::tempdir().unwrap();
    let socket = sockets.path().join("session.sock");
    let server = TestServer::start_with(|c| c.socket = Some(socket.clone())).await;
    server.write_agent_text(
        None,
        "idle",
        &common::test_agent("idle", &["sh", "-c", "echo up; cat"]),
    );
    (server, socket, sockets)
}

async fn root(server: &TestServer, ws: &str) -> String {
    common::direct_root(&mut server.operator().await, ws, "idle", "hello")
        .await
        .session_id
}

/// Waits until the session's status is `status`; returns it.
async fn until_status(
    server: &TestServer,
    id: &str,
    status: SessionStatus,
    limit: Duration,
) -> pb::Session {
    let deadline = Instant::now() + limit;
    loop {
        let session = server.get(id).await.session.unwrap();
        if session.status() == status {
            return session;
        }
        assert!(
            Instant::now() < deadline,
            "{id} never became {status:?}: {session:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// New workspaces go to the runner with the most room (capacity minus
/// active sessions; ties by name); a workspace stays on its runner even
/// when the other has more room.
#[tokio::test]
async fn workspaces_spread_by_room_and_stay_on_their_runner() {
    let (server, socket, _sockets) = service().await;
    let endpoint = format!("http://{}", server.addr);
    let alpha = RunnerProcess::start("alpha", 1, &endpoint, &socket).await;
    let beta = RunnerProcess::start("beta", 3, &endpoint, &socket).await;
    let (w1, w2, w3) = (workspace("one"), workspace("two"), workspace("three"));
    let _containers = Containers::of(&[&alpha, &beta], &[&w1, &w2, &w3]);
    let mut placed = Vec::new();
    // Each starts before the next is made, so each sees the last's load.
    for ws in [&w1, &w2, &w3, &w3] {
        let id = root(&server, ws).await;
        until_status(&server, &id, SessionStatus::Running, MINUTE).await;
        placed.push(id);
    }
    let (s1, s2, s3, s4) = (&placed[0], &placed[1], &placed[2], &placed[3]);
    // beta (room 3, then 2) takes w1 and w2; then both have room 1 and
    // alpha comes first; w3's second session stays on alpha, now full,
    // though beta has room.
    let mut on_beta = vec![s1.clone(), s2.clone()];
    on_beta.sort();
    let mut on_alpha = vec![s3.clone(), s4.clone()];
    on_alpha.sort();
    assert_eq!(beta.exec_ids().await, on_beta);
    assert_eq!(alpha.exec_ids().await, on_alpha);
}

/// A runner killed mid-tree: its sessions fail `runner_lost` within its
/// lease plus a margin, deepest first, so the CALLBACK parent is told of
/// its child's end; a new session of the workspace runs on the other
/// runner; back (registered again), the runner's leftover agents are
/// stopped.
#[tokio::test]
async fn a_killed_runner_loses_its_sessions_and_its_workspace_moves() {
    let (server, socket, _sockets) = service().await;
    let endpoint = format!("http://{}", server.addr);
    let mut alpha = RunnerProcess::start("alpha", 10, &endpoint, &socket).await;
    let beta = RunnerProcess::start("beta", 2, &endpoint, &socket).await;
    let home = workspace("home");
    let _containers = Containers::of(&[&alpha, &beta], &[&home]);
    let parent = root(&server, &home).await;
    until_status(&server, &parent, SessionStatus::Running, MINUTE).await;
    let child = server
        .operator()
        .await
        .create_session(CreateSessionRequest {
            title: "child".into(),
            agent_name: "idle".into(),
            initial_message: "hello child".into(),
            parent_session_id: parent.clone(),
            mode: ExecutionMode::Callback as i32,
            ..Default::default()
        })
        .await
        .expect("create child")
        .into_inner()
        .session
        .unwrap()
        .session_id;
    until_status(&server, &child, SessionStatus::Running, MINUTE).await;
    let mut tree = vec![parent.clone(), child.clone()];
    tree.sort();
    assert_eq!(alpha.exec_ids().await, tree, "the tree runs on alpha");
    assert!(beta.exec_ids().await.is_empty());
    let inbox = server.get(&parent).await.inbox_count;

    alpha.kill().await;
    let killed = Instant::now();
    // The lease, the owner's poll (1 s) and a margin.
    let limit = Duration::from_millis(TTL_MS) + Duration::from_secs(4);
    for id in [&child, &parent] {
        let ended = until_status(&server, id, SessionStatus::Failed, limit).await;
        assert_eq!(ended.end_reason, "runner_lost", "{ended:?}");
    }
    assert!(killed.elapsed() < limit, "took {:?}", killed.elapsed());
    // The child ended first: its parent's notice is in the parent's inbox.
    assert_eq!(server.get(&parent).await.inbox_count, inbox + 1);
    let audit = server
        .operator()
        .await
        .list_audit(ListAuditRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert!(
        audit
            .iter()
            .any(|e| e.action == "callback" && e.target == parent && e.detail.contains(&child)),
        "no callback to the parent: {audit:?}"
    );
    for id in [&parent, &child] {
        assert!(
            audit
                .iter()
                .any(|e| e.action == "runner_lost" && &e.target == id && e.reason == "RUNNER_LOST"),
            "no RUNNER_LOST entry for {id}: {audit:?}"
        );
    }

    // The workspace has no active session left: a new one goes to beta.
    let next = root(&server, &home).await;
    until_status(&server, &next, SessionStatus::Running, MINUTE).await;
    assert_eq!(beta.exec_ids().await, std::slice::from_ref(&next));

    // alpha comes back on its data: its agents ran on meanwhile; its
    // return is reconciled and they are stopped.
    alpha.spawn().await;
    let deadline = Instant::now() + MINUTE;
    loop {
        let execs = alpha.execs().await;
        if execs.len() == 2 && execs.iter().all(|(_, running)| !running) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "alpha's leftover agents were not stopped: {execs:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The new session was not touched.
    assert_eq!(
        server.get(&next).await.session.unwrap().status(),
        SessionStatus::Running
    );
}
