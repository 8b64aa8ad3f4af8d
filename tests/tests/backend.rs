//! The harness's PostgreSQL switch: every test server on a fresh database of
//! `TROUPE_TEST_POSTGRES_URL`, and replicas on the same one. Needs that
//! server (`source scripts/pg-env`).

use sqlx::{Connection, postgres::PgConnection};
use troupe_tests::{
    TestServer,
    postgres::{self, Backend},
};

/// The name of the database a URL names.
fn database_of(url: &str) -> &str {
    let path = url.split('?').next().unwrap_or(url);
    path.rsplit('/').next().unwrap_or_default()
}

async fn current_database(url: &str) -> String {
    let mut connection = PgConnection::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    let (name,): (String,) = sqlx::query_as("SELECT current_database()")
        .fetch_one(&mut connection)
        .await
        .expect("current_database()");
    let _ = connection.close().await;
    name
}

#[tokio::test]
async fn fresh_database_makes_a_new_database_each_time() {
    let first = postgres::fresh_database().await;
    let second = postgres::fresh_database().await;
    assert_ne!(first, second);
    for url in [&first, &second] {
        assert!(database_of(url).starts_with("troupe_"), "{url}");
        assert_eq!(current_database(url).await, database_of(url));
    }
}

/// Each server gets a database of its own, which its replicas share with
/// the same operator token and workspaces, on a port and socket of their own.
#[tokio::test]
async fn each_postgres_server_has_its_own_database_and_its_replicas_share_it() {
    let one = TestServer::start_on(Backend::Postgres, |_| {}).await;
    let other = TestServer::start_on(Backend::Postgres, |_| {}).await;
    let url = one.config.database_url.clone().expect("a database url");
    assert!(postgres::is_postgres(&url), "{url}");
    assert_eq!(current_database(&url).await, database_of(&url));
    assert_ne!(Some(url.clone()), other.config.database_url);

    let replica = one.replica().await;
    assert_eq!(replica.config.database_url, Some(url));
    assert_eq!(replica.config.operator_token, one.config.operator_token);
    assert_eq!(replica.workspaces_dir(), one.workspaces_dir());
    assert_ne!(replica.addr, one.addr);
    assert_ne!(replica.config.socket(), one.config.socket());
    assert_eq!(replica.agents_dir(), one.agents_dir());
    assert!(replica.agents_dir().join("worker.md").is_file());
}

#[tokio::test]
#[should_panic(expected = "replicas share a PostgreSQL database")]
async fn a_replica_of_a_sqlite_server_is_refused() {
    let server = TestServer::start_on(Backend::Sqlite, |_| {}).await;
    server.replica().await;
}
