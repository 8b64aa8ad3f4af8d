//! Spawns, request ids and terminations across replicas, and their start.

use std::{collections::HashSet, time::Duration};

use futures::future::join_all;
use troupe_proto::session::{self as pb, SessionStatus, TrustLevel};
use troupe_session_svc::{Config, Limits};
use troupe_tests::{TestServer, child, message, postgres::Backend, reason, terminate};

use super::{clients, connect, replicas, spawn_race, stop_all, unlimited};

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
    // Each migration once: as many rows as files, none failed.
    let files = std::fs::read_dir(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../store/migrations/postgres"
    ))
    .expect("the migrations")
    .count() as i64;
    assert!(files >= 2, "{files} migrations");
    assert_eq!((applied, failed), (files, 0));
    stop_all(servers).await;
}

/// Starts a service on `url`; returns its start's error, as printed.
async fn start_error(url: &str) -> String {
    let dir = tempfile::tempdir().expect("dir");
    let mut config = Config::with_data_dir(dir.path());
    config.operator_token = Some(troupe_tests::OPERATOR_TOKEN.to_owned());
    config.database_url = Some(url.to_owned());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let error = troupe_session_svc::serve(config, listener, std::future::pending())
        .await
        .expect_err("no database there");
    format!("{error:#}")
}

#[tokio::test]
async fn a_bad_or_unreachable_database_is_a_clear_error_without_the_password() {
    let text = start_error("postgres://troupe:hunter2secret@127.0.0.1:1/nodb").await;
    assert!(text.contains("cannot connect"), "{text}");
    assert!(
        text.contains("postgres://troupe:***@127.0.0.1:1/nodb"),
        "{text}"
    );
    assert!(!text.contains("hunter2secret"), "{text}");
    let text = start_error("postgresql://troupe:hunter2secret@127.0.0.1:notaport/db").await;
    assert!(text.contains("bad database url"), "{text}");
    assert!(
        text.contains("postgresql://troupe:***@127.0.0.1:notaport/db"),
        "{text}"
    );
    assert!(!text.contains("hunter2secret"), "{text}");
}
