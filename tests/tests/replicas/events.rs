//! Events across replicas: every one once, in each shard's order, commits
//! of different shards never waiting on one another, and watchers woken by
//! another replica's commits.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use futures::{StreamExt, future::join_all};
use sqlx::PgConnection;
use troupe_proto::session::{self as pb, TrustLevel};
use troupe_session_svc::{
    cursor::Cursor,
    model::EventFilter,
    shard::Shard,
    store::{EventPage, LogStore, PG_LISTENER_NAME, PgStore},
};
use troupe_tests::message;

use super::{connect, replicas, stop_all, unlimited};

/// The next event of a stream, within `within`.
async fn next_within(
    stream: &mut tonic::Streaming<pb::SessionEvent>,
    within: Duration,
) -> Option<pb::SessionEvent> {
    match tokio::time::timeout(within, stream.next()).await {
        Ok(Some(Ok(event))) => Some(event),
        Ok(other) => panic!("watch ended: {other:?}"),
        Err(_) => None,
    }
}

/// Opens a transaction on `conn` that inserts, and holds uncommitted, an
/// event with the id the sequence hands out next: the service transaction
/// that draws that id next waits on it inside its insert, between taking
/// its id and its commit, until the transaction on `conn` ends. Returns the
/// id.
async fn hold_next_event_id(conn: &mut PgConnection, session_id: &str) -> i64 {
    sqlx::raw_sql("BEGIN")
        .execute(&mut *conn)
        .await
        .expect("begin");
    sqlx::query_scalar(
        "INSERT INTO events (id, session_id, seq, kind, status, at_ms, detail) \
         SELECT last_value + CASE WHEN is_called THEN 1 ELSE 0 END, $1, 1000, 'progress', \
           'pending', 0, '{}' FROM events_id_seq RETURNING id",
    )
    .bind(session_id)
    .fetch_one(conn)
    .await
    .expect("hold the next event id")
}

/// The position in `workspace`'s shard a gRPC event's cursor stands at.
fn position(event: &pb::SessionEvent, workspace: &str) -> i64 {
    let cursor: Cursor = event.cursor.parse().expect("a cursor");
    cursor.after(Shard::of(workspace))
}

/// Waits until a backend waits on a lock that backend `pid` holds.
async fn until_blocked_by(conn: &mut PgConnection, pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let blocked: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)))",
        )
        .bind(pid)
        .fetch_one(&mut *conn)
        .await
        .expect("blocked backends");
        if blocked {
            return;
        }
        assert!(Instant::now() < deadline, "nothing waited on backend {pid}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn watchers_see_every_event_once_in_cursor_order_while_replicas_write() {
    let servers = replicas(3, unlimited()).await;
    let (root, _, _) = servers[0].root("alpha", TrustLevel::Direct).await;
    let (other, _, _) = servers[0].root("alpha", TrustLevel::Direct).await;
    // A watcher on A from cursor 0 over gRPC, and one on the store with a
    // page of 3, both while the writers run.
    let mut op = servers[0].operator().await;
    let mut stream = op
        .watch_sessions(pb::WatchSessionsRequest {
            workspace_id: "alpha".to_owned(),
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    let store = PgStore::open(&servers[0].config.database_url())
        .await
        .expect("open store");
    // First, a message to the other root whose transaction has drawn its
    // event's id and is held before its commit (its insert waits on the
    // test's uncommitted row of that id): the interleaving the events lock
    // exists for. The writers below touch no row it holds, so only that
    // lock keeps their ids, and commits, behind its own.
    let mut admin = connect(&servers[0]).await;
    let mut hold = connect(&servers[0]).await;
    let hold_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut hold)
        .await
        .expect("pid");
    let held_id = hold_next_event_id(&mut hold, &other.session_id).await;
    let mut held_client = servers[1].operator().await;
    let held_target = other.session_id.clone();
    let held_send = tokio::spawn(async move {
        held_client
            .send_message(message(&held_target, "held"))
            .await
            .expect("held send");
    });
    // Its insert waits on the held row.
    until_blocked_by(&mut admin, hold_pid).await;
    let sent = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for (w, server) in servers.iter().cycle().take(12).enumerate() {
        let mut client = server.operator().await;
        let target = root.session_id.clone();
        let sent = sent.clone();
        writers.push(tokio::spawn(async move {
            for n in 0..25 {
                client
                    .send_message(message(&target, format!("w{w} n{n}")))
                    .await
                    .expect("send");
                sent.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    // A writer either commits past the held event (what the shard's row of
    // `event_shards` forbids) or waits for that row behind it (the held
    // message waits on the test, and at least one writer on the message).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: bool = sqlx::query_scalar(
            "SELECT count(*) >= 2 FROM pg_stat_activity \
             WHERE cardinality(pg_blocking_pids(pid)) > 0",
        )
        .fetch_one(&mut admin)
        .await
        .expect("waiters");
        if waiting || sent.load(Ordering::SeqCst) > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the writers neither wrote nor waited"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let writing = join_all(writers);
    tokio::pin!(writing);
    let filter = EventFilter {
        workspace_id: Some("alpha".into()),
        ..EventFilter::default()
    };
    let shard = Shard::of("alpha");
    let mut paged: Vec<i64> = Vec::new();
    let at = |paged: &Vec<i64>| Cursor::at([(shard, paged.last().copied().unwrap_or(0))]);
    // Everything visible while the held message cannot commit.
    loop {
        match store
            .events_after(&filter, &at(&paged), 3)
            .await
            .expect("page")
        {
            EventPage::Events(events) if events.is_empty() => break,
            EventPage::Events(events) => paged.extend(events.iter().map(|e| e.position)),
            EventPage::Expired { .. } => panic!("nothing is pruned here"),
        }
    }
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut hold)
        .await
        .expect("release the held id");
    held_send.await.expect("held send");
    let held: i64 = sqlx::query_scalar("SELECT shard_seq FROM events WHERE id = $1")
        .bind(held_id)
        .fetch_one(&mut admin)
        .await
        .expect("the held message's event is stored");
    assert!(
        paged.iter().all(|&p| p < held),
        "events past the held one ({held}) were visible before it: {paged:?}"
    );
    let mut done = false;
    loop {
        if !done {
            done = futures::poll!(&mut writing).is_ready();
        }
        match store
            .events_after(&filter, &at(&paged), 3)
            .await
            .expect("page")
        {
            EventPage::Events(events) if events.is_empty() && done => break,
            EventPage::Events(events) => paged.extend(events.iter().map(|e| e.position)),
            EventPage::Expired { .. } => panic!("nothing is pruned here"),
        }
    }
    let mut conn = connect(&servers[0]).await;
    let stored: Vec<i64> =
        sqlx::query_scalar("SELECT shard_seq FROM events WHERE shard = $1 ORDER BY shard_seq")
            .bind(i32::from(shard.index()))
            .fetch_all(&mut conn)
            .await
            .expect("positions");
    assert_eq!(stored.len(), 2 + 2 + 1 + 12 * 25);
    assert_eq!(
        paged, stored,
        "the paging watcher saw every event once, in order"
    );
    let mut streamed = Vec::new();
    while streamed.len() < stored.len() {
        let event = next_within(&mut stream, Duration::from_secs(10))
            .await
            .expect("every event reaches the gRPC watcher");
        streamed.push(position(&event, "alpha"));
    }
    assert_eq!(
        streamed, stored,
        "the gRPC watcher saw every event once, in order"
    );
    // Resuming on another replica from a cursor taken mid-way: the rest.
    let mid = stored[stored.len() / 2];
    let mut resumed = servers[1]
        .operator()
        .await
        .watch_sessions(pb::WatchSessionsRequest {
            workspace_id: "alpha".to_owned(),
            after: format!("{shard}:{mid}"),
            ..Default::default()
        })
        .await
        .expect("resume")
        .into_inner();
    let mut rest = Vec::new();
    while let Some(event) = next_within(&mut resumed, Duration::from_millis(500)).await {
        rest.push(position(&event, "alpha"));
    }
    assert_eq!(rest, stored[stored.len() / 2 + 1..]);
    drop(store);
    stop_all(servers).await;
}

/// Opens a transaction on `conn` that takes `workspace`'s shard's row of
/// `event_shards` and writes an event of `session_id` at the position it
/// draws, as every event write does, and holds it uncommitted; returns the
/// position.
async fn hold_shard(conn: &mut PgConnection, workspace: &str, session_id: &str) -> i64 {
    sqlx::raw_sql("BEGIN")
        .execute(&mut *conn)
        .await
        .expect("begin");
    let shard = i32::from(Shard::of(workspace).index());
    let position: i64 =
        sqlx::query_scalar("UPDATE event_shards SET seq = seq + 1 WHERE shard = $1 RETURNING seq")
            .bind(shard)
            .fetch_one(&mut *conn)
            .await
            .expect("the shard's row");
    sqlx::query(
        "INSERT INTO events (id, session_id, seq, shard, shard_seq, kind, status, at_ms, detail) \
         VALUES (nextval('events_id_seq'), $1, 1000, $2, $3, 'progress', 'pending', 0, '{}')",
    )
    .bind(session_id)
    .bind(shard)
    .bind(position)
    .execute(&mut *conn)
    .await
    .expect("the slow event");
    position
}

#[tokio::test]
async fn an_event_whose_commit_waits_is_not_skipped_by_watchers() {
    // A writer that holds its transaction open after drawing its position
    // (as every writer does, under its shard's row): the replicas' writes
    // of that shard wait behind it, so none gets a position past its event
    // and commits first.
    let servers = replicas(2, unlimited()).await;
    let (root, _, _) = servers[0].root("alpha", TrustLevel::Direct).await;
    let mut held = connect(&servers[0]).await;
    let slow = hold_shard(&mut held, "alpha", &root.session_id).await;
    let mut op = servers[1].operator().await;
    let target = root.session_id.clone();
    let writer = tokio::spawn(async move {
        for n in 0..5 {
            op.send_message(message(&target, format!("n{n}")))
                .await
                .expect("send");
        }
    });
    let mut op_a = servers[0].operator().await;
    let mut stream = op_a
        .watch_sessions(pb::WatchSessionsRequest {
            after: format!("{}:{}", Shard::of("alpha"), slow - 1),
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    // Nothing past the held event becomes visible while it is held.
    assert!(
        next_within(&mut stream, Duration::from_millis(500))
            .await
            .is_none(),
        "an event past the uncommitted one was visible"
    );
    sqlx::raw_sql("COMMIT")
        .execute(&mut held)
        .await
        .expect("commit");
    writer.await.expect("writer");
    let first = next_within(&mut stream, Duration::from_secs(5))
        .await
        .expect("the held event");
    assert_eq!(position(&first, "alpha"), slow);
    let mut positions = vec![slow];
    while positions.len() < 6 {
        let event = next_within(&mut stream, Duration::from_secs(5))
            .await
            .expect("the writer's events");
        positions.push(position(&event, "alpha"));
    }
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    stop_all(servers).await;
}

/// The point of ordering the log per shard: a commit of one shard held
/// open does not hold the commits of another shard's workspace, on any
/// replica, nor their watchers.
#[tokio::test]
async fn an_event_commit_of_one_shard_never_waits_for_another_shards() {
    let servers = replicas(2, unlimited()).await;
    let (a, _, _) = servers[0].root("alpha", TrustLevel::Direct).await;
    let other = (0..)
        .map(|n| format!("beta{n}"))
        .find(|w| Shard::of(w) != Shard::of("alpha"))
        .unwrap();
    let (b, _, _) = servers[0].root(&other, TrustLevel::Direct).await;
    // Both replicas serve (each has made its first try for shards).
    for server in &servers {
        let mut client = server.operator().await;
        client
            .send_message(message(&b.session_id, "ready"))
            .await
            .expect("send");
    }
    let mut held = connect(&servers[0]).await;
    hold_shard(&mut held, "alpha", &a.session_id).await;
    let mut watch = servers[0]
        .operator()
        .await
        .watch_sessions(pb::WatchSessionsRequest {
            workspace_id: other.clone(),
            live_only: true,
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    for (n, server) in servers.iter().enumerate() {
        let mut client = server.operator().await;
        let send = client.send_message(message(&b.session_id, format!("n{n}")));
        tokio::time::timeout(Duration::from_secs(2), send)
            .await
            .unwrap_or_else(|_| panic!("a send to {other} waited for alpha's shard"))
            .expect("send");
        let event = next_within(&mut watch, Duration::from_secs(2))
            .await
            .expect("the message's event");
        assert_eq!(event.session_id, b.session_id);
    }
    // Alpha's own writes wait, as they must.
    let mut client = servers[1].operator().await;
    let send = client.send_message(message(&a.session_id, "waits"));
    assert!(
        tokio::time::timeout(Duration::from_millis(500), send)
            .await
            .is_err(),
        "a send to alpha did not wait for its shard's held commit"
    );
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut held)
        .await
        .expect("rollback");
    stop_all(servers).await;
}

#[tokio::test]
async fn a_watcher_hears_of_another_replicas_commits_by_listen_and_else_by_polling() {
    let servers = replicas(2, unlimited()).await;
    let (root, _, _) = servers[0].root("alpha", TrustLevel::Direct).await;
    let mut stream = servers[0]
        .operator()
        .await
        .watch_sessions(pb::WatchSessionsRequest {
            session_id: root.session_id.clone(),
            live_only: true,
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    let mut on_b = servers[1].operator().await;
    // LISTEN: each commit on B reaches A's watcher well within the poll's period.
    for n in 0..5 {
        let sent = Instant::now();
        on_b.send_message(message(&root.session_id, format!("n{n}")))
            .await
            .expect("send");
        next_within(&mut stream, Duration::from_millis(300))
            .await
            .unwrap_or_else(|| panic!("message {n} not seen within 300 ms"));
        assert!(sent.elapsed() < Duration::from_millis(300));
    }
    // With the listening connections killed, polling still brings it.
    let mut admin = connect(&servers[0]).await;
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND application_name = $1",
    )
    .bind(PG_LISTENER_NAME)
    .fetch_all(&mut admin)
    .await
    .expect("terminate listeners");
    assert_eq!(killed.len(), 2, "one listener per replica");
    on_b.send_message(message(&root.session_id, "after the kill"))
        .await
        .expect("send");
    let event = next_within(
        &mut stream,
        troupe_session_svc::store::PG_POLL_EVERY + Duration::from_millis(700),
    )
    .await
    .expect("seen through polling");
    assert_eq!(event.session_id, root.session_id);
    stop_all(servers).await;
}
