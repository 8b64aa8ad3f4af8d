//! The background work divided among replicas, on PostgreSQL with two real
//! `troupe-session` replicas and one real runner (run under
//! `scripts/pg-env`; the binary comes from `cargo build -p
//! troupe-session-svc`): a replica that joins takes its share within a few
//! seconds, each replica drives the agents of its own shards, and one that
//! stops (SIGTERM) hands its shards over at once, long before its leases
//! would lapse, its agents' output and messages neither lost nor repeated;
//! and so through a rolling restart of every replica under load.

use crate::common;

use std::time::{Duration, Instant};

use common::{
    MINUTE, TestRunner, direct_root,
    replicas::{
        LINES, assert_each_line_once, balanced, output, output_with, replica_for, shard_lease,
        taken_over, until,
    },
};
use troupe_session_svc::{
    shard::{SHARDS, Shard},
    store::PgStore,
};

/// The replicas' leases: long, so a handover that came at once is told
/// from one that waited for the leases to lapse.
const TTL: Duration = Duration::from_secs(20);

/// A workspace of `runner`'s whose shard is in `half` (0: the low half,
/// 1: the high one).
fn workspace_in_half(runner: &TestRunner, name: &str, half: u16) -> String {
    loop {
        let workspace = runner.workspace(name);
        if Shard::of(&workspace).index() / (SHARDS / 2) == half {
            return workspace;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_divide_the_shards_and_a_stopping_one_hands_its_own_over_at_once() {
    let url = troupe_tests::postgres::fresh_database().await;
    let runner = TestRunner::driven().await;
    let endpoint = format!("http://{}", runner.addr);
    let store = PgStore::open(&url).await.unwrap();
    let first = replica_for(&url, &endpoint, None, TTL);
    balanced(&store, 1).await;
    let joined_at = Instant::now();
    let second = replica_for(&url, &endpoint, None, TTL);
    balanced(&store, 2).await;
    let joined = joined_at.elapsed();
    assert!(
        joined < Duration::from_secs(5),
        "the second replica took its share after {joined:?}"
    );

    // One agent on each replica's shards, both created through the first.
    let (low, high) = (
        workspace_in_half(&runner, "low", 0),
        workspace_in_half(&runner, "high", 1),
    );
    let by_low = shard_lease(&store, &low).await;
    let by_high = shard_lease(&store, &high).await;
    assert_eq!(by_low.holder.pid(), Some(first.pid()));
    assert_eq!(by_high.holder.pid(), Some(second.pid()));
    let mut via_first = first.operator().await;
    let mut roots = Vec::new();
    for workspace in [&low, &high] {
        let root = direct_root(&mut via_first, workspace, "printer", "first")
            .await
            .session_id;
        roots.push(root);
    }
    for root in &roots {
        output_with(&store, root, "line20\n", "an agent never printed").await;
    }

    // Stopped mid-output: its shards are the first's at once, not once
    // their leases (20 s) lapse; a message sent meanwhile is delivered once.
    let stopped_at = Instant::now();
    assert!(second.stop().await, "the second replica stops cleanly");
    let taken = taken_over(&store, &by_high, Duration::from_secs(5)).await;
    let handed = stopped_at.elapsed();
    assert_eq!(taken.holder.pid(), Some(first.pid()));
    assert!(
        handed < Duration::from_secs(3),
        "the shards were handed over after {handed:?}"
    );
    balanced(&store, 1).await;
    via_first
        .send_message(troupe_tests::message(&roots[1], "after the handover"))
        .await
        .unwrap();
    for root in &roots {
        let out = until("an agent's output never completed", MINUTE, || async {
            let out = output(&store, root).await;
            (out.contains(&format!("line{LINES}\n")) && out.contains("\"first\"")).then_some(out)
        })
        .await;
        assert_each_line_once(&out);
        assert_eq!(out.matches("\"first\"").count(), 1, "{out}");
    }
    let out = until("the message never came back", MINUTE, || async {
        let out = output(&store, &roots[1]).await;
        out.contains("after the handover").then_some(out)
    })
    .await;
    assert_eq!(out.matches("after the handover").count(), 1, "{out}");
    for root in &roots {
        via_first
            .terminate_session(troupe_tests::terminate(root))
            .await
            .unwrap();
    }
    assert!(first.stop().await);
}

/// Every replica restarted one by one (SIGTERM, then a new process on the
/// same database) while agents of both halves print: each new replica takes
/// its share within 5 s, under load, and no agent's line or message is lost
/// or repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_loses_and_repeats_nothing() {
    let url = troupe_tests::postgres::fresh_database().await;
    let runner = TestRunner::driven().await;
    let endpoint = format!("http://{}", runner.addr);
    let store = PgStore::open(&url).await.unwrap();
    let mut replicas = vec![replica_for(&url, &endpoint, None, TTL)];
    balanced(&store, 1).await;
    replicas.push(replica_for(&url, &endpoint, None, TTL));
    balanced(&store, 2).await;
    let mut via = replicas[0].operator().await;
    let mut roots = Vec::new();
    for (name, half) in [("a", 0), ("b", 0), ("c", 1), ("d", 1)] {
        let workspace = workspace_in_half(&runner, name, half);
        let root = direct_root(&mut via, &workspace, "printer", "first")
            .await
            .session_id;
        roots.push(root);
    }
    for root in &roots {
        output_with(&store, root, "line10\n", "an agent never printed").await;
    }
    // Each replica in turn: stopped, a message to every agent meanwhile,
    // then a new one that must take its share within 5 s.
    for turn in 0..2 {
        let old = replicas.remove(0);
        assert!(old.stop().await, "a replica stops cleanly");
        let mut via = replicas[0].operator().await;
        for root in &roots {
            via.send_message(troupe_tests::message(root, format!("turn {turn}")))
                .await
                .unwrap();
        }
        let joined_at = Instant::now();
        replicas.push(replica_for(&url, &endpoint, None, TTL));
        balanced(&store, 2).await;
        let joined = joined_at.elapsed();
        assert!(
            joined < Duration::from_secs(5),
            "a new replica took its share after {joined:?} under load"
        );
    }
    for root in &roots {
        let out = until("an agent's output never completed", MINUTE, || async {
            let out = output(&store, root).await;
            (out.contains(&format!("line{LINES}\n"))
                && ["\"first\"", "turn 0", "turn 1"]
                    .iter()
                    .all(|m| out.contains(m)))
            .then_some(out)
        })
        .await;
        assert_each_line_once(&out);
        for message in ["\"first\"", "turn 0", "turn 1"] {
            assert_eq!(out.matches(message).count(), 1, "{message} once in {out}");
        }
    }
    let mut via = replicas[0].operator().await;
    for root in &roots {
        via.terminate_session(troupe_tests::terminate(root))
            .await
            .unwrap();
    }
    for replica in replicas {
        assert!(replica.stop().await);
    }
}
