//! Several runners and several replicas (PostgreSQL only: run under
//! `scripts/pg-env`; the service binary comes from `cargo build -p
//! troupe-session-svc`): two `troupe-session` processes without `--runner`
//! on one database, two `troupe-runner` processes registered with both.
//! Sessions created through either replica are placed by room and stay on
//! their workspace's runner; the replica that owns the background work is
//! killed (SIGKILL): the runners' registrations go on through the other
//! replica, so no session is lost, and the other replica, now the owner,
//! places and starts new sessions.

use crate::common;

use std::time::{Duration, Instant};

use common::{
    MINUTE,
    pair::require_agent_tools,
    replicas::start_replica,
    runners::{Containers, RunnerProcess, TTL_MS, workspace},
};
use troupe_proto::session::{GetSessionRequest, SessionStatus};
use troupe_tests::process::SessionProcess;

/// A replica on `url` with the agent `idle`, and no runner of its own.
fn replica(url: &str) -> SessionProcess {
    start_replica(url, None, &[("idle", "echo up; cat")], None)
}

async fn root(through: &SessionProcess, ws: &str) -> String {
    common::direct_root(&mut through.operator().await, ws, "idle", "hello")
        .await
        .session_id
}

async fn status(through: &SessionProcess, id: &str) -> (SessionStatus, String) {
    let session = through
        .operator()
        .await
        .get_session(GetSessionRequest {
            session_id: id.to_owned(),
        })
        .await
        .expect("get")
        .into_inner()
        .session
        .unwrap();
    (session.status(), session.end_reason)
}

async fn until_running(through: &SessionProcess, id: &str) {
    let deadline = Instant::now() + MINUTE;
    loop {
        let (now, reason) = status(through, id).await;
        if now == SessionStatus::Running {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{id} never ran: {now:?} {reason}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn runners_outlive_a_killed_replica_and_the_next_owner_places_on_them() {
    common::require_engine();
    require_agent_tools();
    let url = troupe_tests::postgres::fresh_database().await;
    // The first replica up takes the lease of the background work.
    let first = replica(&url);
    first.operator().await;
    let second = replica(&url);
    second.operator().await;
    let services = format!("{},{}", first.endpoint, second.endpoint);
    let sockets = tempfile::tempdir().unwrap();
    let socket = sockets.path().join("session.sock");
    let alpha = RunnerProcess::start("alpha", 1, &services, &socket).await;
    let beta = RunnerProcess::start("beta", 3, &services, &socket).await;
    let (w1, w2, w3, w4) = (
        workspace("r-one"),
        workspace("r-two"),
        workspace("r-three"),
        workspace("r-four"),
    );
    let _containers = Containers::of(&[&alpha, &beta], &[&w1, &w2, &w3, &w4]);
    // Through either replica, each started before the next is made.
    let mut placed = Vec::new();
    for (ws, through) in [(&w1, &first), (&w2, &second), (&w3, &first), (&w3, &second)] {
        let id = root(through, ws).await;
        until_running(through, &id).await;
        placed.push(id);
    }
    let mut on_beta = vec![placed[0].clone(), placed[1].clone()];
    on_beta.sort();
    let mut on_alpha = vec![placed[2].clone(), placed[3].clone()];
    on_alpha.sort();
    assert_eq!(beta.exec_ids().await, on_beta);
    assert_eq!(alpha.exec_ids().await, on_alpha);

    first.kill();
    // Past the runners' lease and the replicas' (and a margin), nothing was
    // lost: the runners renewed through the second replica.
    tokio::time::sleep(Duration::from_millis(TTL_MS * 2 + 1000)).await;
    for id in &placed {
        assert_eq!(
            status(&second, id).await,
            (SessionStatus::Running, String::new()),
            "{id}"
        );
    }
    // The second replica owns the work now: a new workspace goes to beta,
    // the runner with room.
    let next = root(&second, &w4).await;
    until_running(&second, &next).await;
    let mut on_beta = [on_beta, vec![next]].concat();
    on_beta.sort();
    assert_eq!(beta.exec_ids().await, on_beta);
}
