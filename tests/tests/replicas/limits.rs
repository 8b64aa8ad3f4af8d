//! One set of limits for every replica of a database: a replica whose flags
//! differ from the stored limits refuses to start, naming each flag with
//! both values; one started with `--adopt-limits` stores its own, and the
//! running replicas enforce them within a second or two.

use std::time::Duration;

use tonic::Code;
use troupe_proto::session::TrustLevel;
use troupe_session_svc::{Config, Limits};
use troupe_tests::{TestServer, child, postgres::Backend, reason};

/// What `serve` says when started with `config` (it must stop by itself).
async fn start_failure(config: Config) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let ended = tokio::time::timeout(
        Duration::from_secs(30),
        troupe_session_svc::serve(config, listener, std::future::pending()),
    )
    .await
    .expect("the start ends by itself");
    format!("{:#}", ended.expect_err("refused to start"))
}

fn limits(max_children: u32) -> Limits {
    Limits {
        max_children,
        spawn_rate_per_sec: 0.0,
        ..Limits::default()
    }
}

#[tokio::test]
async fn a_replica_with_other_limits_refuses_to_start_and_one_that_adopts_them_changes_all() {
    let first = TestServer::start_on(Backend::Postgres, |c| c.limits = limits(20)).await;
    // Answering, it has stored its limits.
    let (root, mut on_first, _) = first.root("alpha", TrustLevel::Direct).await;

    let dir = tempfile::tempdir().expect("dir");
    let mut other = first.config.clone();
    other.data_dir = dir.path().join("data");
    other.socket = None;
    other.limits = limits(3);
    let refused = start_failure(other.clone()).await;
    assert!(
        refused.contains("--max-children 3 (here) against 20 (the database)"),
        "{refused}"
    );
    assert!(refused.contains("--adopt-limits"), "{refused}");

    // Adopted: the first replica enforces 3 children as well.
    let adopting = first
        .replica_with(|c| {
            c.limits = limits(3);
            c.adopt_limits = true;
        })
        .await;
    tokio::time::sleep(troupe_session_svc::rules::FOLLOW_EVERY * 3).await;
    for n in 0..3 {
        on_first
            .create_session(child(&format!("kid {n}")))
            .await
            .unwrap_or_else(|e| panic!("child {n} of {}: {e:?}", root.session_id));
    }
    let fourth = on_first
        .create_session(child("kid 3"))
        .await
        .expect_err("past the adopted limit");
    assert_eq!(fourth.code(), Code::ResourceExhausted);
    assert_eq!(reason(&fourth), "CHILD_QUOTA_EXCEEDED");
    adopting.stop().await;
    first.stop().await;
}
