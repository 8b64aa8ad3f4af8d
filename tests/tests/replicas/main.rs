//! Several session services ("replicas") on one PostgreSQL database, driven
//! over gRPC: quotas hold across replicas, request ids replay on any of
//! them, a termination leaves nothing active under an ended node, events
//! reach every watcher once and in cursor order, and a watcher hears of
//! another replica's commits (by LISTEN, else by polling), they share
//! agent definitions and the operator token, and a write that loses a
//! deadlock is run again.
//!
//! PostgreSQL only, whatever `TROUPE_TEST_BACKEND` says:
//! `TROUPE_TEST_POSTGRES_URL` is the URL of a server where the tests may
//! create databases (`source scripts/pg-env`); each test makes a fresh one.
mod conflicts;
mod console;
mod events;
mod limits;
mod shared;
mod spawns;

use futures::future::join_all;
use sqlx::{Connection, PgConnection};
use troupe_session_svc::Limits;
use troupe_tests::{Client, TestServer, child, postgres::Backend, reason};

/// `n` replicas on a fresh database: the first, then the others started
/// together.
pub async fn replicas(n: usize, limits: Limits) -> Vec<TestServer> {
    let first = TestServer::start_on(Backend::Postgres, |c| c.limits = limits).await;
    let others = join_all((1..n).map(|_| first.replica())).await;
    let mut all = vec![first];
    all.extend(others);
    all
}

/// A connection to the replicas' database.
pub async fn connect(server: &TestServer) -> PgConnection {
    PgConnection::connect(&server.config.database_url())
        .await
        .expect("connect")
}

pub async fn stop_all(servers: Vec<TestServer>) {
    for server in servers {
        server.stop().await;
    }
}

/// Clients acting with `token` on each replica.
pub async fn clients(servers: &[TestServer], token: &str) -> Vec<Client> {
    join_all(servers.iter().map(|s| s.client(Some(token)))).await
}

pub fn unlimited() -> Limits {
    Limits {
        max_depth: 5,
        max_tree_sessions: 1000,
        max_children: 1000,
        max_active_per_workspace: 1000,
        spawn_rate_per_sec: 0.0,
        spawn_burst: 3,
    }
}

/// Sends `n` spawns at once from the sessions of `tokens`, round robin over
/// the replicas; returns the successes and the refusals' reasons.
pub async fn spawn_race(
    servers: &[TestServer],
    tokens: &[String],
    n: usize,
) -> (usize, Vec<String>) {
    let mut all = Vec::new();
    for token in tokens {
        all.push(clients(servers, token).await);
    }
    let calls = (0..n).map(|i| {
        let mut client = all[i % all.len()][i % servers.len()].clone();
        async move { client.create_session(child(&format!("race {i}"))).await }
    });
    let results = join_all(calls).await;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let refused = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(reason))
        .collect();
    (ok, refused)
}
