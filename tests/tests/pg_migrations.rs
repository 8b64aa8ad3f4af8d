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

/// Each runner's lease left, in milliseconds, read through both columns
/// against one reading of the clock (none: static).
async fn leases(conn: &mut PgConnection) -> Vec<(String, Option<f64>, Option<f64>)> {
    sqlx::query(
        "WITH now AS (SELECT clock_timestamp() AS t) \
         SELECT name, \
           CAST(lease_expires_ms - extract(epoch FROM now.t) * 1000 AS FLOAT8) AS by_ms, \
           CAST(extract(epoch FROM lease_expires - now.t) * 1000 AS FLOAT8) AS by_ts \
         FROM runners, now ORDER BY name",
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
    let names: Vec<&str> = seen.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["default", "new", "old", "old2"],
        "runners: {seen:?}"
    );
    for ((name, by_ms, by_ts), granted_s) in
        seen.iter()
            .zip([None, Some(400.0), Some(200.0), Some(500.0)])
    {
        match (by_ms, by_ts, granted_s) {
            (None, None, None) => {}
            (Some(ms), Some(ts), Some(s)) => {
                // The columns differ by the millisecond column's rounding
                // at most; the lease is what its writer granted, less the
                // moments since.
                assert!(
                    (ms - ts).abs() <= 1.0,
                    "{name}: {ms} ms by lease_expires_ms, {ts} by lease_expires"
                );
                assert!(
                    (s * 1000.0 - 10_000.0..=s * 1000.0 + 1.0).contains(ms),
                    "{name}: {ms} ms left, granted {s} s"
                );
            }
            other => panic!("{name}: the columns disagree on whether it has a lease: {other:?}"),
        }
    }
}
