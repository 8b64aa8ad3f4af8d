//! The harness's PostgreSQL switch: every test server on a fresh database of
//! `TROUPE_TEST_POSTGRES_URL`, and replicas on the same one. Needs that
//! server (`source scripts/pg-env`).

use sqlx::{AssertSqlSafe, Connection, postgres::PgConnection};
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

/// A database whose process has exited is dropped by the next fresh one;
/// this process's own databases, and a name of another form, stay.
#[tokio::test]
async fn databases_of_exited_processes_are_dropped() {
    let mut exited = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let pid = exited.id();
    exited.wait().expect("wait true");
    let orphan = format!("troupe_{pid}_{}", uuid::Uuid::new_v4().simple());
    let foreign = format!("troupe_{}", uuid::Uuid::new_v4().simple());
    let admin = postgres::admin_url();
    let mut connection = PgConnection::connect(&admin).await.expect("admin");
    for name in [&orphan, &foreign] {
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut connection)
            .await
            .expect("create");
    }
    let ours = postgres::fresh_database().await;
    postgres::fresh_database().await;

    let exists = |name: String| {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)",
        )
        .bind(name)
    };
    assert!(
        !exists(orphan)
            .fetch_one(&mut connection)
            .await
            .expect("orphan")
    );
    assert!(
        exists(foreign.clone())
            .fetch_one(&mut connection)
            .await
            .expect("foreign")
    );
    assert!(
        exists(database_of(&ours).to_owned())
            .fetch_one(&mut connection)
            .await
            .expect("ours")
    );
    sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE {foreign}")))
        .execute(&mut connection)
        .await
        .expect("drop");
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
