//! A write that loses a real deadlock is run again, and the call succeeds.

use std::time::{Duration, Instant};

use sqlx::PgConnection;
use troupe_proto::session::TrustLevel;
use troupe_tests::child;

use super::{connect, replicas, stop_all, unlimited};

/// Deadlocks counted in the database's statistics so far.
async fn deadlocks(conn: &mut PgConnection) -> i64 {
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await
        .expect("fresh statistics");
    sqlx::query_scalar("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(conn)
        .await
        .expect("deadlocks")
}

#[tokio::test]
async fn a_spawn_that_loses_a_deadlock_is_run_again_and_succeeds() {
    let servers = replicas(1, unlimited()).await;
    let (root, mut as_root, _) = servers[0].root("alpha", TrustLevel::Direct).await;
    let mut admin = connect(&servers[0]).await;
    let before = deadlocks(&mut admin).await;
    // The test takes the spawn's locks in the other order (tree, then
    // workspace), and waits longer than the service before it looks for a
    // deadlock: the service's transaction is the one PostgreSQL aborts.
    let mut other = connect(&servers[0]).await;
    let other_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut other)
        .await
        .expect("pid");
    sqlx::raw_sql("SET deadlock_timeout = '1min'; BEGIN")
        .execute(&mut other)
        .await
        .expect("begin");
    sqlx::query("SELECT 1 FROM trees WHERE tree_id = $1 FOR UPDATE")
        .bind(&root.tree_id)
        .execute(&mut other)
        .await
        .expect("lock the tree");
    let spawn = tokio::spawn(async move { as_root.create_session(child("contested")).await });
    // The spawn holds the workspace's row and waits for the tree's.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)))",
        )
        .bind(other_pid)
        .fetch_one(&mut admin)
        .await
        .expect("blocked backends");
        if waiting {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the spawn never waited for the tree"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Now the cycle: this waits for the spawn's workspace lock until
    // PostgreSQL aborts the spawn's transaction.
    sqlx::query("SELECT 1 FROM workspaces WHERE workspace_id = 'alpha' FOR UPDATE")
        .execute(&mut other)
        .await
        .expect("lock the workspace once the spawn lost");
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut other)
        .await
        .expect("rollback");
    let created = spawn
        .await
        .expect("spawn task")
        .expect("the spawn succeeds, run again after its deadlock")
        .into_inner();
    let session = created.session.expect("session");
    assert_eq!(session.parent_session_id, root.session_id);
    // It was a deadlock, and the child is there once.
    let deadline = Instant::now() + Duration::from_secs(10);
    while deadlocks(&mut admin).await <= before {
        assert!(Instant::now() < deadline, "PostgreSQL counted no deadlock");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let children: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM sessions WHERE parent_session_id = $1")
            .bind(&root.session_id)
            .fetch_one(&mut admin)
            .await
            .expect("children");
    assert_eq!(children, 1);
    stop_all(servers).await;
}
