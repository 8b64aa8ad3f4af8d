//! Space the database no longer needs is returned to the file system, and
//! the write-ahead log stays within its limit under output that never
//! pauses.

use super::*;

/// Pruned events and dropped output free pages; the database returns them
/// to the file system, a bounded amount per upkeep tick (`UpkeepStore::maintain`).
#[tokio::test]
async fn the_database_file_shrinks_once_its_events_are_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let budget = OutputBudget {
        session_bytes: 1 << 30,
        total_bytes: 1 << 30,
    };
    let store = open(dir.path(), budget).await;
    running(&store, "sess_big").await;
    for i in 0..512 {
        print(&store, "sess_big", i + 2, output(vec![b'x'; 64 << 10])).await;
    }
    store.checkpoint().await.unwrap();
    let db = dir.path().join("troupe.db");
    let full = file_len(&db);
    assert!(full > 32 << 20, "32 MiB printed, {full} bytes stored");

    troupe_tests::stores::prune_all(&store, &fence(&store).await, 0).await;
    let mut calls = 0;
    let mut slowest = Duration::ZERO;
    loop {
        let started = std::time::Instant::now();
        let returned = store.maintain().await.expect("upkeep").pages_returned;
        slowest = slowest.max(started.elapsed());
        if returned == 0 {
            break;
        }
        calls += 1;
        assert!(calls < 100, "space never all returned");
    }
    store.checkpoint().await.unwrap();
    let after = file_len(&db);
    eprintln!("{full} bytes, then {after} after {calls} calls (slowest {slowest:?})");
    assert!(
        after < full / 8,
        "the file holds {after} bytes after pruning, {full} before ({calls} calls)"
    );
    assert!(calls > 1, "each call returns a bounded amount");
}

/// A database made before the store returned space is switched over once,
/// when it is opened.
#[tokio::test]
async fn an_older_database_is_made_to_return_space() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("{}?mode=rwc", db_url(dir.path()));
    {
        let mut old = sqlx::SqliteConnection::connect(&url).await.unwrap();
        sqlx::query("CREATE TABLE older (x)")
            .execute(&mut old)
            .await
            .unwrap();
        let mode: i64 = sqlx::query_scalar("PRAGMA auto_vacuum")
            .fetch_one(&mut old)
            .await
            .unwrap();
        assert_eq!(mode, 0);
    }
    let store = open(dir.path(), OutputBudget::default()).await;
    drop(store);
    let mut db = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let mode: i64 = sqlx::query_scalar("PRAGMA auto_vacuum")
        .fetch_one(&mut db)
        .await
        .unwrap();
    assert_eq!(mode, 2, "incremental");
}

/// The service's upkeep keeps the write-ahead log within its limit (and
/// what one write adds) while an agent's output lands without a pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_ahead_log_stays_within_its_limit_under_output_that_never_pauses() {
    const LIMIT: u64 = 4 << 20;
    const CHUNK: usize = 64 << 10;
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), OutputBudget::default())
        .await
        .with_wal_limit(LIMIT);
    running(&store, "sess_flood").await;
    let cancel = CancellationToken::new();
    let upkeep = tokio::spawn(troupe_session_svc::upkeep(store.clone(), cancel.clone()));
    // Measured from a thread of its own, every millisecond.
    let wal = dir.path().join("troupe.db-wal");
    let stop = Arc::new(AtomicBool::new(false));
    let largest = Arc::new(AtomicU64::new(0));
    let sampler = std::thread::spawn({
        let (stop, largest) = (stop.clone(), largest.clone());
        move || {
            while !stop.load(Ordering::Relaxed) {
                largest.fetch_max(file_len(&wal), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    let written = 40 * LIMIT;
    let started = std::time::Instant::now();
    for seq in 0..written / CHUNK as u64 {
        print(&store, "sess_flood", seq + 2, output(vec![b'y'; CHUNK])).await;
    }
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    cancel.cancel();
    upkeep.await.unwrap();
    let largest = largest.load(Ordering::Relaxed);
    let bound = LIMIT + LIMIT / 2;
    eprintln!("the log reached {largest} bytes (limit {LIMIT}) in {elapsed:?}");
    assert!(
        largest <= bound,
        "the log reached {largest} bytes (limit {LIMIT}, bound {bound}) while \
         {written} bytes were printed in {elapsed:?}"
    );
}
