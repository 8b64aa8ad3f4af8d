//! PostgreSQL's migrations under a rolling update: a database migrated by
//! the release before (through 0020) holds runners, the new release
//! migrates it, and replicas of both releases then write runners' leases
//! side by side (the old ones `lease_expires`, the new ones
//! `lease_expires_ms`). Every writer's lease must read the same through
//! either column, or a new replica would take an old one's live runner for
//! lapsed and fail its sessions.
//!
//! PostgreSQL only: `TROUPE_TEST_POSTGRES_URL` (`source scripts/pg-env`).

use std::path::Path;

use sqlx::{Connection, PgConnection, Row};
use troupe_tests::postgres::fresh_database;

/// The migrations of `session-svc` for PostgreSQL numbered from `from`
/// through `through`, in order.
fn migrations(from: u32, through: u32) -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../store/migrations/postgres");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("migrations")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            let n: u32 = p.file_name().unwrap().to_str().unwrap()[..4]
                .parse()
                .expect("numbered");
            (from..=through).contains(&n)
        })
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read_to_string(p).expect("read"))
        .collect()
}

/// Each runner's lease left, in whole seconds, read through both columns
/// (none: static).
async fn leases(conn: &mut PgConnection) -> Vec<(String, Option<i64>, Option<i64>)> {
    sqlx::query(
        "SELECT name, \
           (lease_expires_ms - CAST(extract(epoch FROM clock_timestamp()) * 1000 AS BIGINT)) \
             / 1000 AS by_ms, \
           CAST(floor(extract(epoch FROM lease_expires - clock_timestamp())) AS BIGINT) AS by_ts \
         FROM runners ORDER BY name",
    )
    .fetch_all(conn)
    .await
    .expect("leases")
    .iter()
    .map(|r| (r.get("name"), r.get("by_ms"), r.get("by_ts")))
    .collect()
}

#[tokio::test]
async fn runners_leases_read_the_same_through_both_releases_columns() {
    let url = fresh_database().await;
    let mut conn = PgConnection::connect(&url).await.expect("connect");
    for sql in migrations(1, 20) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .expect("the release before's migrations");
    }
    sqlx::raw_sql(
        "INSERT INTO runners (name, endpoint, capacity, lease_expires) VALUES \
           ('old', 'http://old', 4, clock_timestamp() + interval '100 seconds'), \
           ('default', 'unix', 8, NULL)",
    )
    .execute(&mut conn)
    .await
    .expect("runners before the update");
    for sql in migrations(21, u32::MAX) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .expect("this release's migrations");
    }
    // Old replicas renew and register through `lease_expires`; new ones
    // through `lease_expires_ms`, the static runner included.
    sqlx::raw_sql(
        "UPDATE runners SET lease_expires = clock_timestamp() + interval '200 seconds' \
           WHERE name = 'old'; \
         INSERT INTO runners (name, endpoint, capacity, lease_expires) \
           VALUES ('old2', 'http://old2', 2, clock_timestamp() + interval '300 seconds'); \
         INSERT INTO runners (name, endpoint, capacity, lease_expires_ms) \
           VALUES ('new', 'http://new', 2, \
             CAST(extract(epoch FROM clock_timestamp()) * 1000 AS BIGINT) + 400000); \
         INSERT INTO runners (name, endpoint, capacity, lease_expires_ms) \
           VALUES ('old2', 'http://old2', 2, \
             CAST(extract(epoch FROM clock_timestamp()) * 1000 AS BIGINT) + 500000) \
           ON CONFLICT (name) DO UPDATE SET lease_expires_ms = excluded.lease_expires_ms; \
         INSERT INTO runners (name, endpoint, capacity, lease_expires_ms) \
           VALUES ('default', 'unix', 9, NULL) \
           ON CONFLICT (name) DO UPDATE SET capacity = excluded.capacity, lease_expires_ms = NULL; \
         UPDATE runners SET capacity = 5 WHERE name = 'new';",
    )
    .execute(&mut conn)
    .await
    .expect("writers of both releases");
    let seen = leases(&mut conn).await;
    let expect = |name: &str, s: i64| (name.to_owned(), Some(s - 1), Some(s - 1));
    assert_eq!(
        seen,
        vec![
            ("default".to_owned(), None, None),
            expect("new", 400),
            expect("old", 200),
            expect("old2", 500),
        ],
        "each runner's lease, in seconds left, through lease_expires_ms and lease_expires"
    );
}
