//! The session service's disk: agents' output kept within byte budgets (per
//! session and in total) with every drop marked where it happened, every
//! byte of the output tail as printed, space the database no longer needs
//! returned to the file system, and the write-ahead log within its limit
//! under output that never pauses.

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use base64::Engine as _;
use sqlx::Connection;
use tokio_util::sync::CancellationToken;
use troupe_session_svc::{
    error::QuotaLeft,
    model::{
        Action, AuditRecord, EventFilter, EventRow, NewSession, Principal, ProcessChange, Trust,
    },
    store::{Created, EventPage, Fence, Holder, LogStore, OutputBudget, SqliteStore, Store},
};

const TAIL: usize = 16 << 10;

async fn open(dir: &Path, budget: OutputBudget) -> SqliteStore {
    let url = format!("sqlite://{}", dir.join("troupe.db").display());
    SqliteStore::open(&url)
        .await
        .expect("open")
        .with_output_budget(budget)
}

/// A root session whose agent has started (runner event 1).
async fn running(store: &SqliteStore, id: &str) {
    let new = NewSession {
        session_id: id.to_owned(),
        workspace_id: "alpha".into(),
        trust: Trust::Direct,
        agent_name: "worker".into(),
        agent_command: "[\"/bin/cat\"]".into(),
        title: id.to_owned(),
        created_by: Principal::Operator,
        trace: None,
        initial_message: None,
        notify_parent: false,
        budget: Default::default(),
        write_scope: Default::default(),
        on_parent_end: Default::default(),
    };
    let audit = AuditRecord {
        caller: Principal::Operator,
        action: Action::CreateRootSession,
        target: id.to_owned(),
        allowed: true,
        reason: "OK".into(),
        detail: String::new(),
    };
    let quota = |_| {
        Ok(QuotaLeft {
            tree_sessions_remaining: 0,
            depth_remaining: 0,
            children_remaining: 0,
        })
    };
    let created = store.create_root(new, None, audit, &quota).await;
    assert!(matches!(created, Ok(Created::New { .. })));
    let fence = fence(store).await;
    troupe_tests::embedded_runner(store, &fence).await;
    store.start_process(&fence, id).await.expect("process");
    print(store, id, 1, ProcessChange::Started).await;
}

/// The lease's term for background writes: this test's, taken once.
async fn fence(store: &SqliteStore) -> Fence {
    let holder = Holder::named("tests");
    let ttl = Duration::from_secs(3600);
    if let Some(fence) = store.acquire_lease(&holder, ttl).await.expect("lease") {
        return fence;
    }
    let lease = store.lease().await.expect("lease").expect("held");
    Fence {
        holder: lease.holder,
        epoch: lease.epoch,
        ttl,
    }
}

async fn print(store: &SqliteStore, id: &str, seq: u64, change: ProcessChange) {
    let applied = store
        .record_process(&fence(store).await, id, seq, change, TAIL)
        .await
        .expect("record");
    assert!(applied.is_some(), "runner event {seq} of {id} applied");
}

fn output(data: Vec<u8>) -> ProcessChange {
    ProcessChange::Output {
        stream: "stdout",
        data,
    }
}

/// Chunk `i`: 1 KiB naming its number.
fn chunk(i: u64) -> Vec<u8> {
    let mut data = format!("<{i:06}>").into_bytes();
    data.resize(1024, b'.');
    data
}

/// Every event of `session` after `after`, as a watcher pages through them.
async fn watch(store: &SqliteStore, session: &str, mut after: i64) -> Vec<EventRow> {
    let filter = EventFilter {
        session_id: Some(session.to_owned()),
        ..Default::default()
    };
    let mut all = Vec::new();
    loop {
        let EventPage::Events(page) = store.events_after(&filter, after, 100).await.unwrap() else {
            panic!("cursor {after} expired");
        };
        let Some(last) = page.last() else {
            return all;
        };
        after = last.id;
        all.extend(page);
    }
}

fn data(event: &EventRow) -> Vec<u8> {
    let detail: serde_json::Value = serde_json::from_str(&event.detail).unwrap();
    base64::engine::general_purpose::STANDARD
        .decode(detail["data"].as_str().unwrap())
        .unwrap()
}

/// (dropped bytes, dropped events) of an `output_truncated` event.
fn dropped(event: &EventRow) -> (u64, u64) {
    let detail: serde_json::Value = serde_json::from_str(&event.detail).unwrap();
    (
        detail["dropped_bytes"].as_u64().unwrap(),
        detail["dropped_events"].as_u64().unwrap(),
    )
}

/// What a watcher makes of `events`: the chunk numbers it was sent, and
/// the totals of the last marker it met.
fn read(events: &[EventRow]) -> (Vec<u64>, Option<(u64, u64)>) {
    let mut chunks = Vec::new();
    let mut marker = None;
    for e in events {
        match e.kind.as_str() {
            "output" => {
                let data = data(e);
                let number = std::str::from_utf8(&data[1..7]).unwrap();
                chunks.push(number.parse().unwrap());
            }
            "output_truncated" => marker = Some(dropped(e)),
            _ => {}
        }
    }
    (chunks, marker)
}

#[tokio::test]
async fn output_past_a_sessions_budget_is_dropped_oldest_first_and_the_gap_marked() {
    let dir = tempfile::tempdir().unwrap();
    let budget = OutputBudget {
        session_bytes: 64 << 10,
        total_bytes: 1 << 30,
    };
    let store = open(dir.path(), budget).await;
    running(&store, "sess_loud").await;
    // A watcher that keeps up as it goes; one that read the first ten
    // chunks and went away.
    let mut live = Vec::new();
    let mut after = 0;
    let mut went_away = 0;
    for i in 0..300u64 {
        print(&store, "sess_loud", i + 2, output(chunk(i))).await;
        let new = watch(&store, "sess_loud", after).await;
        after = new.last().map_or(after, |e| e.id);
        live.extend(new);
        if i == 9 {
            went_away = after;
        }
    }

    let (seen, _) = read(&live);
    assert_eq!(
        seen,
        (0..300).collect::<Vec<_>>(),
        "a watcher that keeps up is sent every chunk once, in order"
    );

    let all = watch(&store, "sess_loud", 0).await;
    let (kept, marker) = read(&all);
    let kinds: Vec<&str> = all.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "output_truncated").count(),
        1,
        "one marker: {kinds:?}"
    );
    let marker_at = kinds.iter().position(|k| *k == "output_truncated").unwrap();
    assert_eq!(
        kinds.iter().position(|k| *k == "output"),
        Some(marker_at + 1),
        "the marker stands where the dropped output stood: {kinds:?}"
    );
    let (bytes, events) = marker.unwrap();
    assert!(
        kept.len() as u64 * 1024 <= budget.session_bytes,
        "{} kept",
        kept.len()
    );
    assert_eq!(
        kept,
        (events..300).collect::<Vec<_>>(),
        "the newest output is kept, whole"
    );
    assert_eq!(bytes, events * 1024);

    // The watcher that went away is told of the gap before any output.
    let resumed = watch(&store, "sess_loud", went_away).await;
    assert_eq!(
        resumed.first().map(|e| e.kind.as_str()),
        Some("output_truncated")
    );
    let (after_gap, marker) = read(&resumed);
    assert_eq!(after_gap, kept);
    assert!(marker.unwrap().1 >= 10, "its totals cover what it missed");
    // One that read everything is sent nothing again.
    assert!(watch(&store, "sess_loud", after).await.is_empty());
}

#[tokio::test]
async fn the_total_budget_takes_from_the_sessions_keeping_the_most() {
    let dir = tempfile::tempdir().unwrap();
    let budget = OutputBudget {
        session_bytes: 1 << 30,
        total_bytes: 64 << 10,
    };
    let store = open(dir.path(), budget).await;
    running(&store, "sess_quiet").await;
    running(&store, "sess_loud").await;
    for i in 0..8 {
        print(&store, "sess_quiet", i + 2, output(chunk(i))).await;
    }
    for i in 0..200 {
        print(&store, "sess_loud", i + 2, output(chunk(i))).await;
    }
    let (quiet, marker) = read(&watch(&store, "sess_quiet", 0).await);
    assert_eq!(
        quiet,
        (0..8).collect::<Vec<_>>(),
        "the quiet session keeps its output"
    );
    assert_eq!(marker, None);
    let (loud, marker) = read(&watch(&store, "sess_loud", 0).await);
    let (bytes, events) = marker.expect("the loud session's gap is marked");
    assert_eq!(loud, (events..200).collect::<Vec<_>>());
    assert_eq!(bytes, events * 1024);
    assert!(
        (quiet.len() + loud.len()) as u64 * 1024 <= budget.total_bytes,
        "{} + {} chunks kept",
        quiet.len(),
        loud.len()
    );
}

/// Pruning by retention takes what it prunes off the counts, so the
/// budgets keep counting what is stored.
#[tokio::test]
async fn pruned_output_leaves_the_budgets_counts() {
    let dir = tempfile::tempdir().unwrap();
    let budget = OutputBudget {
        session_bytes: 32 << 10,
        total_bytes: 1 << 30,
    };
    let store = open(dir.path(), budget).await;
    running(&store, "sess_a").await;
    for i in 0..100 {
        print(&store, "sess_a", i + 2, output(chunk(i))).await;
    }
    store
        .prune_events(&fence(&store).await, 10)
        .await
        .expect("prune");
    let url = format!("sqlite://{}", dir.path().join("troupe.db").display());
    let mut db = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let (stored, counted, total): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT COALESCE(SUM(bytes), 0) FROM events WHERE kind = 'output'), \
         (SELECT output_bytes FROM processes WHERE session_id = 'sess_a'), \
         (SELECT value FROM meta WHERE key = 'output_bytes')",
    )
    .fetch_one(&mut db)
    .await
    .unwrap();
    assert_eq!((counted, total), (stored, stored));
    assert_eq!(stored, 10 * 1024, "the ten newest events are output");
}

/// A NUL, bytes that are not UTF-8, characters of several bytes: the tail is
/// the last bytes printed, every one of them.
#[tokio::test]
async fn every_byte_printed_reaches_the_output_tail() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), OutputBudget::default()).await;
    running(&store, "sess_bytes").await;
    let chunks: [&[u8]; 4] = [
        b"visible\0hidden",
        b"\xff\xfe\0",
        "\u{e9}t\u{e9}".as_bytes(),
        b"\0end",
    ];
    let mut printed = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        print(&store, "sess_bytes", i as u64 + 2, output(c.to_vec())).await;
        printed.extend_from_slice(c);
    }
    let tail = store
        .process("sess_bytes")
        .await
        .unwrap()
        .unwrap()
        .output_tail;
    assert_eq!(tail, printed);

    // Past the tail's size, its last bytes, counted as bytes.
    let limited = store
        .record_process(
            &fence(&store).await,
            "sess_bytes",
            10,
            output(b"\0\0tail".to_vec()),
            8,
        )
        .await
        .unwrap();
    assert!(limited.is_some());
    printed.extend_from_slice(b"\0\0tail");
    let tail = store
        .process("sess_bytes")
        .await
        .unwrap()
        .unwrap()
        .output_tail;
    assert_eq!(tail, printed[printed.len() - 8..]);
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Pruned events and dropped output free pages; the database returns them
/// to the file system, a bounded amount per upkeep tick (`Store::maintain`).
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

    store
        .prune_events(&fence(&store).await, 0)
        .await
        .expect("prune");
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
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("troupe.db").display()
    );
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
