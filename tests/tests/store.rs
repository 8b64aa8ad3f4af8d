//! The SQLite store: its in-memory view of the sessions against the
//! database under it (writes cancelled at any point, as when a client that
//! hangs up drops the handler's future, never leave the two apart), and the
//! size of its write-ahead log under writes that never pause, and what it
//! makes of stored text it does not know.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::Poll,
    time::Duration,
};

use sqlx::{Connection, Row};
use troupe_session_svc::{
    Limits,
    error::{QuotaLeft, SessionError, StorageKind},
    model::{
        Action, EventFilter, Idempotency, NewMessage, NewSession, Principal, ProcessChange, Trust,
    },
    policy,
    store::{Created, EventPage, SqliteStore, prelude::*},
};
use troupe_tests::stores::{self, operator_audit as audit};

fn new_session(id: &str, initial_message: bool) -> NewSession {
    NewSession {
        initial_message: initial_message.then(|| NewMessage {
            message_id: format!("msg_{id}"),
            sender: Principal::Operator,
            body: "hello".into(),
        }),
        ..stores::new_session(id, Trust::Direct)
    }
}

/// Every other write carries a request id: its transaction opens before
/// the batch, so a cut can fall between the two.
fn request_id(i: u64, action: Action) -> Option<Idempotency> {
    (i % 8 < 4).then(|| Idempotency {
        caller: Principal::Operator,
        action,
        request_id: format!("req_{i}"),
        payload_hash: String::new(),
        window_start_ms: 0,
    })
}

/// Polls `write` at most `polls` times, 20 µs apart (SQLite answers from
/// its own thread meanwhile), then drops it unfinished.
async fn cut_after<F: Future>(polls: usize, write: F) -> Option<F::Output> {
    let mut write = std::pin::pin!(write);
    for _ in 0..polls {
        if let Poll::Ready(out) = futures::poll!(write.as_mut()) {
            return Some(out);
        }
        std::thread::sleep(Duration::from_micros(20));
    }
    None
}

#[tokio::test]
async fn cancelled_writes_never_leave_the_ledger_behind_the_database() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("troupe.db").display());
    let store = SqliteStore::open(&url).await.expect("open");
    let fence = stores::lease_fence(&store).await;
    let limits = Limits {
        max_depth: 100,
        max_tree_sessions: u32::MAX,
        max_children: u32::MAX,
        max_active_per_workspace: u32::MAX,
        spawn_rate_per_sec: 1e6,
        ..Limits::default()
    };
    let root_quota = |_| {
        Ok(QuotaLeft {
            tree_sessions_remaining: 0,
            depth_remaining: 0,
            children_remaining: 0,
        })
    };
    let root = "sess_root";
    let created = store
        .create_root(
            new_session(root, true),
            None,
            audit(Action::CreateRootSession, root),
            &root_quota,
        )
        .await
        .expect("root");
    assert!(matches!(created, Created::New { .. }));

    let (mut done, mut refused, mut cancelled) = (0, 0, 0);
    let mut ids = vec![root.to_owned()];
    for i in 0..400u64 {
        let id = format!("sess_{i}");
        let parent = ids[(i as usize * 7) % ids.len()].clone();
        let creates = i % 4 < 2;
        let store = store.clone();
        let write = async {
            match i % 4 {
                0 | 1 => store
                    .create_child(
                        &parent.as_str().into(),
                        new_session(&id, i % 2 == 0),
                        request_id(i, Action::CreateSession),
                        audit(Action::CreateSession, &parent),
                        &|ctx| policy::admit_spawn(ctx, &limits),
                    )
                    .await
                    .map(drop),
                2 => store
                    .send_message(
                        &parent.as_str().into(),
                        NewMessage {
                            message_id: format!("msg_{i}"),
                            sender: Principal::Operator,
                            body: format!("message {i}"),
                        },
                        request_id(i, Action::SendMessage),
                        audit(Action::SendMessage, &parent),
                        troupe_tests::stores::UNBOUNDED,
                        &|_| Ok(()),
                    )
                    .await
                    .map(drop),
                _ if i % 16 != 15 => store
                    .record_process(
                        &fence,
                        &parent.as_str().into(),
                        i,
                        ProcessChange::Started,
                        1024,
                    )
                    .await
                    .map(drop),
                _ => store
                    .terminate(
                        &(ids.last().expect("a session")).into(),
                        &Principal::Operator,
                        "test",
                        audit(Action::TerminateSession, &parent),
                        &|_, _| Ok(()),
                    )
                    .await
                    .map(drop),
            }
        };
        // Cut after a few polls, so that writes are dropped before, during
        // and after their statements reach SQLite.
        match cut_after((i as usize * 7) % 41, write).await {
            Some(Ok(())) => done += 1,
            // A rule's answer; never the database's (such as a transaction
            // a cancelled write left open).
            Some(Err(SessionError::Refused { .. } | SessionError::SessionNotFound { .. })) => {
                refused += 1
            }
            Some(Err(e)) => panic!("write {i} failed: {e:?}"),
            None => cancelled += 1,
        }
        if creates
            && store
                .get_session(&id.as_str().into())
                .await
                .expect("get")
                .is_some()
        {
            ids.push(id);
        }
    }
    assert!(
        done > 20 && cancelled > 20 && refused < 100,
        "{done} done, {refused} refused, {cancelled} cancelled"
    );

    // Any write settles what a cancelled one left.
    store
        .append_audit(audit(Action::GetSession, root))
        .await
        .expect("audit");
    let mut conn = sqlx::SqliteConnection::connect(&url).await.expect("reader");
    let rows = sqlx::query(
        "SELECT session_id, status, inbox_seq, spawn_tat_ms, ended_at_ms, end_reason FROM sessions",
    )
    .fetch_all(&mut conn)
    .await
    .expect("sessions");
    let mut stored = 0;
    for row in &rows {
        let id: String = row.get("session_id");
        let ledger = store
            .get_session(&id.as_str().into())
            .await
            .expect("get")
            .unwrap_or_else(|| panic!("{id} is in the database, not in the ledger"));
        let status: String = row.get("status");
        assert_eq!(
            (
                status.as_str(),
                row.get::<i64, _>("inbox_seq"),
                row.get::<i64, _>("spawn_tat_ms"),
                row.get::<Option<i64>, _>("ended_at_ms"),
                row.get::<Option<String>, _>("end_reason"),
            ),
            (
                troupe_proto::status::status_str(ledger.status),
                ledger.inbox_seq,
                ledger.spawn_tat_ms,
                ledger.ended_at_ms,
                ledger.end_reason.as_ref().map(ToString::to_string),
            ),
            "{id}"
        );
        stored += 1;
    }
    let (listed, _) = store
        .list_workspace(&"alpha".into(), false, true, 0, 10_000)
        .await
        .expect("list");
    assert_eq!(
        listed.len(),
        stored,
        "the ledger holds no session the database lacks"
    );
}

/// Checkpoints keep the write-ahead log bounded even when writes never
/// pause: a passive checkpoint alone leaves the frames written while it ran,
/// so the log never starts over and grows with every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_ahead_log_stays_bounded_under_writes_that_never_pause() {
    const LIMIT: u64 = 1 << 20;
    const BOUND: u64 = 4 * LIMIT;
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("troupe.db").display());
    let store = SqliteStore::open(&url)
        .await
        .expect("open")
        .with_wal_limit(LIMIT);
    let wal = dir.path().join("troupe.db-wal");

    // Writes until told to stop; counts them.
    let writes = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn({
        let (store, writes, stop) = (store.clone(), writes.clone(), stop.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                store
                    .append_audit(audit(Action::ListWorkspaceSessions, "alpha"))
                    .await
                    .expect("write");
                writes.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    // Each write appends at least a frame of a page (1 KiB, plus a header)
    // to the log: run until the writes alone would have grown it well past
    // the bound.
    let enough = || writes.load(Ordering::Relaxed) * 1024 > 3 * BOUND;
    let mut largest = 0;
    let started = std::time::Instant::now();
    while !enough() && started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        store.checkpoint().await.expect("checkpoint");
        largest = largest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
    }
    stop.store(true, Ordering::Relaxed);
    writer.await.expect("writer");
    let writes = writes.load(Ordering::Relaxed);
    assert!(enough(), "only {writes} writes: too few to test the bound");
    assert!(
        largest < BOUND,
        "the log reached {largest} bytes after {writes} writes (bound {BOUND})"
    );
}

/// A value whose stored text the store does not know (a sender, an exit
/// reason, an event kind) fails the read as a storage error, the way a
/// broken row should: never a panic, never a made-up value.
#[tokio::test]
async fn unknown_stored_text_is_a_storage_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("troupe.db").display());
    let store = SqliteStore::open(&url).await.expect("open");
    let fence = stores::lease_fence(&store).await;
    let id = "sess_odd";
    store
        .create_root(
            new_session(id, true),
            None,
            audit(Action::CreateRootSession, id),
            &|_| Ok(QuotaLeft::default()),
        )
        .await
        .expect("root");
    troupe_tests::embedded_runner(&store, &fence).await;
    store
        .start_process(&fence, &id.into())
        .await
        .expect("process");
    assert_eq!(store.undelivered(&id.into()).await.expect("inbox").len(), 1);
    assert!(store.process(&id.into()).await.expect("process").is_some());
    let filter = EventFilter {
        session_id: Some(id.into()),
        ..EventFilter::default()
    };
    assert!(matches!(
        store.events_after(&filter, &Default::default(), 10).await.expect("events"),
        EventPage::Events(events) if events.len() == 2
    ));

    let mut db = sqlx::SqliteConnection::connect(&url).await.expect("db");
    for statement in [
        "UPDATE messages SET sender = 'someone'",
        "UPDATE processes SET exit_code = 0, exit_reason = 'vanished'",
        "UPDATE events SET kind = 'exploded' WHERE kind = 'created'",
    ] {
        sqlx::query(statement)
            .execute(&mut db)
            .await
            .expect(statement);
    }
    let storage = |e: SessionError| match e {
        SessionError::Storage(e) => e.kind,
        other => panic!("not a storage error: {other:?}"),
    };
    let inbox = store
        .undelivered(&id.into())
        .await
        .expect_err("unknown sender");
    assert_eq!(storage(inbox), StorageKind::Other);
    let process = store
        .process(&id.into())
        .await
        .expect_err("unknown exit reason");
    assert_eq!(storage(process), StorageKind::Other);
    let events = store
        .events_after(&filter, &Default::default(), 10)
        .await
        .expect_err("kind");
    assert_eq!(storage(events), StorageKind::Other);
}
