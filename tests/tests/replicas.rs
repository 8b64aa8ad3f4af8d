//! Several session services ("replicas") on one PostgreSQL database, driven
//! over gRPC: quotas hold across replicas, request ids replay on any of
//! them, a termination leaves nothing active under an ended node, events
//! reach every watcher once and in cursor order, and a watcher hears of
//! another replica's commits (by LISTEN, else by polling).
//!
//! PostgreSQL only, whatever `TROUPE_TEST_BACKEND` says:
//! `TROUPE_TEST_POSTGRES_URL` is the URL of a server where the tests may
//! create databases (`source scripts/pg-env`); each test makes a fresh one.

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use futures::{StreamExt, future::join_all};
use sqlx::{Connection, PgConnection};
use troupe_proto::session::{self as pb, SessionStatus, TrustLevel};
use troupe_session_svc::{
    Config, Limits,
    model::EventFilter,
    store::{EventPage, PG_LISTENER_NAME, PgStore, Store},
};
use troupe_tests::{Client, TestServer, child, message, postgres::Backend, reason, terminate};

/// `n` replicas on a fresh database: the first, then the others started
/// together.
async fn replicas(n: usize, limits: Limits) -> Vec<TestServer> {
    let first = TestServer::start_on(Backend::Postgres, |c| c.limits = limits).await;
    let others = join_all((1..n).map(|_| first.replica())).await;
    let mut all = vec![first];
    all.extend(others);
    all
}

/// A connection to the replicas' database.
async fn connect(server: &TestServer) -> PgConnection {
    PgConnection::connect(&server.config.database_url())
        .await
        .expect("connect")
}

async fn stop_all(servers: Vec<TestServer>) {
    for server in servers {
        server.stop().await;
    }
}

/// Clients acting with `token` on each replica.
async fn clients(servers: &[TestServer], token: &str) -> Vec<Client> {
    join_all(servers.iter().map(|s| s.client(Some(token)))).await
}

fn unlimited() -> Limits {
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
async fn spawn_race(servers: &[TestServer], tokens: &[String], n: usize) -> (usize, Vec<String>) {
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

#[tokio::test]
async fn concurrent_spawns_at_limit_minus_one_admit_exactly_one_per_quota() {
    // (quota, limits, spawns made before the race, reason of the others).
    let cases = [
        (
            "tree",
            Limits {
                max_tree_sessions: 3,
                ..unlimited()
            },
            1,
            "TREE_QUOTA_EXCEEDED",
        ),
        (
            "children",
            Limits {
                max_children: 2,
                ..unlimited()
            },
            1,
            "CHILD_QUOTA_EXCEEDED",
        ),
        (
            "workspace",
            Limits {
                max_active_per_workspace: 3,
                ..unlimited()
            },
            0,
            "WORKSPACE_QUOTA_EXCEEDED",
        ),
        (
            "rate",
            Limits {
                spawn_rate_per_sec: 0.001,
                spawn_burst: 2,
                ..unlimited()
            },
            1,
            "RATE_LIMITED",
        ),
    ];
    for (quota, limits, before, refusal) in cases {
        let servers = replicas(3, limits).await;
        let (root, mut as_root, token) = servers[0].root("alpha", TrustLevel::Direct).await;
        let mut tokens = vec![token];
        // The workspace case spawns from two trees: the workspace's lock,
        // not a tree's or a parent's, must be what orders them.
        if quota == "workspace" {
            let (_, _, other) = servers[1].root("alpha", TrustLevel::Direct).await;
            tokens.push(other);
        }
        for i in 0..before {
            let kid = as_root
                .create_session(child(&format!("before {i}")))
                .await
                .unwrap_or_else(|e| panic!("{quota}: spawn before the race: {e:?}"));
            // The tree case spawns from two parents: the tree's lock, not a
            // parent's, must be what orders them.
            if quota == "tree" {
                let kid = kid.into_inner().session.expect("session");
                tokens.push(servers[2].token_for(&kid.session_id).await);
            }
        }
        let (ok, refused) = spawn_race(&servers, &tokens, 12).await;
        assert_eq!(
            ok, 1,
            "{quota}: exactly one spawn admitted; refusals {refused:?}"
        );
        assert_eq!(refused.len(), 11, "{quota}");
        assert!(
            refused.iter().all(|r| r == refusal),
            "{quota}: every other spawn refused with {refusal}: {refused:?}"
        );
        let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sessions")
            .fetch_one(&mut connect(&servers[0]).await)
            .await
            .expect("count");
        assert_eq!(
            stored as usize,
            1 + usize::from(quota == "workspace") + before + 1,
            "{quota}: sessions stored"
        );
        assert_eq!(
            servers[2]
                .get(&root.session_id)
                .await
                .session
                .expect("root")
                .session_id,
            root.session_id
        );
        stop_all(servers).await;
    }
}

#[tokio::test]
async fn spawns_past_the_depth_limit_are_refused_on_every_replica() {
    // Depth is no count: a session at the deepest level is refused on
    // every replica, whatever else runs.
    let servers = replicas(
        3,
        Limits {
            max_depth: 1,
            ..unlimited()
        },
    )
    .await;
    let (_, mut as_root, _) = servers[0].root("alpha", TrustLevel::Direct).await;
    let kid = troupe_tests::create_child(&mut as_root, child("deepest")).await;
    let token = servers[1].token_for(&kid.session_id).await;
    let (ok, refused) = spawn_race(&servers, &[token], 12).await;
    assert_eq!(ok, 0);
    assert!(refused.iter().all(|r| r == "DEPTH_EXCEEDED"), "{refused:?}");
    stop_all(servers).await;
}

#[tokio::test]
async fn a_request_id_replays_on_another_replica_and_conflicts_with_another_payload() {
    let servers = replicas(3, unlimited()).await;
    let (root, _, token) = servers[0].root("alpha", TrustLevel::Direct).await;
    let request = pb::CreateSessionRequest {
        request_id: "req-1".to_owned(),
        ..child("once")
    };
    // Sent at once to every replica, twice each: one session.
    let mut calls = Vec::new();
    for client in clients(&servers, &token).await {
        for _ in 0..2 {
            let mut client = client.clone();
            let request = request.clone();
            calls.push(async move { client.create_session(request).await });
        }
    }
    let ids: HashSet<String> = join_all(calls)
        .await
        .into_iter()
        .map(|r| {
            r.expect("create")
                .into_inner()
                .session
                .expect("s")
                .session_id
        })
        .collect();
    assert_eq!(ids.len(), 1, "one session for one request id: {ids:?}");
    assert_eq!(servers[1].get(&root.session_id).await.children.len(), 1);
    // A retry later, on another replica, replays it.
    let mut on_c = servers[2].client(Some(&token)).await;
    let again = on_c
        .create_session(request.clone())
        .await
        .expect("retry")
        .into_inner();
    assert!(ids.contains(&again.session.expect("s").session_id));
    // The same id with another payload is a conflict, on any replica.
    let other = pb::CreateSessionRequest {
        title: "another".to_owned(),
        ..request
    };
    let status = on_c.create_session(other).await.expect_err("conflict");
    assert_eq!(status.code(), tonic::Code::AlreadyExists);
    assert_eq!(reason(&status), "IDEMPOTENCY_CONFLICT");
    // Messages too.
    let send = pb::SendMessageRequest {
        request_id: "m-1".to_owned(),
        ..message(&root.session_id, "hello")
    };
    let mut op_a = servers[0].operator().await;
    let mut op_b = servers[1].operator().await;
    let first = op_a.send_message(send.clone()).await.expect("send");
    let second = op_b.send_message(send.clone()).await.expect("replay");
    assert_eq!(first.into_inner(), second.into_inner());
    let status = op_b
        .send_message(pb::SendMessageRequest {
            message: "other".to_owned(),
            ..send
        })
        .await
        .expect_err("conflict");
    assert_eq!(reason(&status), "IDEMPOTENCY_CONFLICT");
    stop_all(servers).await;
}

#[tokio::test]
async fn a_termination_racing_spawns_leaves_no_active_child_under_an_ended_node() {
    let servers = replicas(3, unlimited()).await;
    // Over the rounds, spawns both landed before the end and were refused
    // after it: the termination raced them.
    let (mut landed, mut refused) = (0, 0);
    for round in 0..6u64 {
        let (root, mut as_root, _) = servers[0].root("alpha", TrustLevel::Direct).await;
        let mut parents = Vec::new();
        for i in 0..3 {
            let kid = troupe_tests::create_child(&mut as_root, child(&format!("p{i}"))).await;
            parents.push(servers[1].token_for(&kid.session_id).await);
        }
        // Spawns under every child on replicas B and C, while A ends the root.
        let mut spawns = Vec::new();
        for (i, token) in parents.iter().enumerate() {
            for (k, server) in servers[1..].iter().enumerate() {
                let mut client = server.client(Some(token)).await;
                spawns.push(async move {
                    let mut results = Vec::new();
                    for n in 0..6 {
                        let spawned = client.create_session(child(&format!("c{i}-{k}-{n}"))).await;
                        results.push(spawned.is_ok());
                    }
                    results
                });
            }
        }
        let mut op = servers[0].operator().await;
        let ending = async {
            tokio::time::sleep(Duration::from_millis(4 * round)).await;
            op.terminate_session(terminate(&root.session_id))
                .await
                .expect("terminate");
        };
        let (results, ()) = tokio::join!(join_all(spawns), ending);
        for ok in results.into_iter().flatten() {
            if ok {
                landed += 1;
            } else {
                refused += 1;
            }
        }
        // Every session of the tree: none active under an ended one.
        let listed = servers[2]
            .operator()
            .await
            .list_workspace_sessions(pb::ListWorkspaceSessionsRequest {
                workspace_id: "alpha".to_owned(),
                include_ended: true,
                page_size: 1000,
                page_token: String::new(),
            })
            .await
            .expect("list")
            .into_inner()
            .sessions;
        for s in listed.iter().filter(|s| s.tree_id == root.tree_id) {
            let active = s.status == SessionStatus::Pending as i32
                || s.status == SessionStatus::Running as i32;
            assert!(
                !active,
                "round {round}: {} is active after its root ended",
                s.session_id
            );
        }
    }
    assert!(
        landed > 0 && refused > 0,
        "the race overlapped: {landed} landed, {refused} refused"
    );
    stop_all(servers).await;
}

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

#[tokio::test]
async fn watchers_see_every_event_once_in_cursor_order_while_replicas_write() {
    let servers = replicas(3, unlimited()).await;
    let (root, _, _) = servers[0].root("alpha", TrustLevel::Direct).await;
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
    let mut writers = Vec::new();
    for (w, server) in servers.iter().cycle().take(12).enumerate() {
        let mut client = server.operator().await;
        let target = root.session_id.clone();
        writers.push(tokio::spawn(async move {
            for n in 0..25 {
                client
                    .send_message(message(&target, format!("w{w} n{n}")))
                    .await
                    .expect("send");
            }
        }));
    }
    let writing = join_all(writers);
    tokio::pin!(writing);
    let filter = EventFilter {
        workspace_id: Some("alpha".to_owned()),
        ..EventFilter::default()
    };
    let mut paged = Vec::new();
    let mut done = false;
    loop {
        if !done {
            done = futures::poll!(&mut writing).is_ready();
        }
        let after = paged.last().copied().unwrap_or(0);
        match store.events_after(&filter, after, 3).await.expect("page") {
            EventPage::Events(events) if events.is_empty() && done => break,
            EventPage::Events(events) => paged.extend(events.iter().map(|e| e.id)),
            EventPage::Expired { .. } => panic!("nothing is pruned here"),
        }
    }
    let mut conn = connect(&servers[0]).await;
    let stored: Vec<i64> = sqlx::query_scalar("SELECT id FROM events ORDER BY id")
        .fetch_all(&mut conn)
        .await
        .expect("ids");
    assert_eq!(stored.len(), 2 + 12 * 25);
    assert_eq!(
        paged, stored,
        "the paging watcher saw every event once, in order"
    );
    let mut streamed = Vec::new();
    while streamed.len() < stored.len() {
        let event = next_within(&mut stream, Duration::from_secs(10))
            .await
            .expect("every event reaches the gRPC watcher");
        streamed.push(event.cursor as i64);
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
            after_cursor: mid as u64,
            ..Default::default()
        })
        .await
        .expect("resume")
        .into_inner();
    let mut rest = Vec::new();
    while let Some(event) = next_within(&mut resumed, Duration::from_millis(500)).await {
        rest.push(event.cursor as i64);
    }
    assert_eq!(rest, stored[stored.len() / 2 + 1..]);
    drop(store);
    stop_all(servers).await;
}

#[tokio::test]
async fn an_event_whose_commit_waits_is_not_skipped_by_watchers() {
    // A writer that holds its transaction open after taking the events
    // lock (as every writer does before drawing ids): the replicas' writes
    // wait behind it, so none gets an id past its event and commits first.
    let servers = replicas(2, unlimited()).await;
    let (root, _, _) = servers[0].root("alpha", TrustLevel::Direct).await;
    let mut held = connect(&servers[0]).await;
    let mut tx = held.begin().await.expect("begin");
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(troupe_session_svc::store::PG_EVENTS_LOCK)
        .execute(&mut *tx)
        .await
        .expect("events lock");
    let slow: i64 = sqlx::query_scalar(
        "INSERT INTO events (id, session_id, seq, kind, status, at_ms, detail) \
         VALUES (nextval('events_id_seq'), $1, 1000, 'progress', 'pending', 0, '{}') RETURNING id",
    )
    .bind(&root.session_id)
    .fetch_one(&mut *tx)
    .await
    .expect("slow event");
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
            after_cursor: slow as u64 - 1,
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
    tx.commit().await.expect("commit");
    writer.await.expect("writer");
    let first = next_within(&mut stream, Duration::from_secs(5))
        .await
        .expect("the held event");
    assert_eq!(first.cursor as i64, slow);
    let mut cursors = vec![first.cursor];
    while cursors.len() < 6 {
        let event = next_within(&mut stream, Duration::from_secs(5))
            .await
            .expect("the writer's events");
        cursors.push(event.cursor);
    }
    assert!(cursors.windows(2).all(|w| w[0] < w[1]), "{cursors:?}");
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

#[tokio::test]
async fn replicas_starting_together_on_a_new_database_migrate_it_once() {
    let url = troupe_tests::postgres::fresh_database().await;
    let servers = join_all((0..4).map(|_| {
        let url = url.clone();
        TestServer::start_on(Backend::Sqlite, move |c| c.database_url = Some(url))
    }))
    .await;
    for server in &servers {
        server.root("alpha", TrustLevel::Direct).await;
    }
    let (applied, failed): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), COUNT(*) FILTER (WHERE NOT success) FROM _sqlx_migrations",
    )
    .fetch_one(&mut connect(&servers[0]).await)
    .await
    .expect("migrations");
    assert_eq!((applied, failed), (1, 0));
    stop_all(servers).await;
}

#[tokio::test]
async fn an_unreachable_database_is_a_clear_error_without_the_password() {
    let dir = tempfile::tempdir().expect("dir");
    let mut config = Config::with_data_dir(dir.path());
    config.operator_token = Some(troupe_tests::OPERATOR_TOKEN.to_owned());
    config.database_url = Some("postgres://troupe:hunter2secret@127.0.0.1:1/nodb".to_owned());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let error = troupe_session_svc::serve(config, listener, std::future::pending())
        .await
        .expect_err("no database there");
    let text = format!("{error:#}");
    assert!(
        text.contains("postgres://troupe:***@127.0.0.1:1/nodb"),
        "{text}"
    );
    assert!(!text.contains("hunter2secret"), "{text}");
}
