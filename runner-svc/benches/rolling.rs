//! A replica joining under load, and every replica restarted one by one
//! under load: how long a joining replica takes to hold its share, how
//! long a stopping one's shards take to find new holders and its
//! replacement to hold its share, and what a watcher of every workspace
//! and the database hold of every agent's output at the end (lines lost
//! or repeated, counted).
//!
//! Real parts: a PostgreSQL database on the cluster of
//! `TROUPE_TEST_POSTGRES_URL`, release `troupe-session` processes with
//! `--runner` and otherwise their default flags, one real runner (served
//! in this process) on the Docker engine of `DOCKER_HOST`. `SESSIONS`
//! agents, each in a workspace of its own (so their shards spread over the
//! replicas), print a numbered line every 50 ms until told to stop.
//!
//! `REPLICAS` replicas start and divide the shards; one more joins (timed
//! from its start to holding its share, 64 / (`REPLICAS` + 1)); then each
//! of them in turn gets SIGTERM (timed to every shard it held having a new
//! holder) and a replacement is started (timed to holding its share), the
//! watcher moved off a replica before it stops, output flowing between
//! steps.
//!
//! ```sh
//! source scripts/pg-env && source scripts/docker-env && scripts/build-image
//! cargo build --release -p troupe-session-svc
//! cargo bench -p troupe-runner-svc --bench rolling
//! ```

#[path = "../tests/common/mod.rs"]
mod common;
mod printers;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::{MINUTE, TestRunner, replicas::until};
use printers::{Replica, Starter, Watcher, printer, stop_and_count};
use troupe_session_svc::{
    shard::SHARDS,
    store::{PgStore, prelude::*},
};
use troupe_tests::bench::percentile;

/// Replicas before the join.
const REPLICAS: usize = 3;
/// Agents printing at once, each in a workspace of its own.
const SESSIONS: usize = 8;

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench());
}

async fn bench() {
    let url = troupe_tests::postgres::fresh_database().await;
    let store = PgStore::open(&url).await.expect("open the database");
    let runner = TestRunner::driven().await;
    let mut starter = Starter::new(&url, &format!("http://{}", runner.addr), "rolling");
    let mut replicas = starter.start_all(REPLICAS).await;
    holds_share(&store, &replicas[0], REPLICAS).await;
    let mut sessions = Vec::new();
    for i in 0..SESSIONS {
        let workspace = runner.workspace(&format!("rolling{i}"));
        sessions.push(printer(&replicas[i % REPLICAS], &workspace, &format!("printer {i}")).await);
    }
    let seen = Arc::new(Mutex::new(printers::Seen::default()));
    let mut watcher = Watcher::start(seen, "", &replicas[0].process.endpoint);
    watcher.flowing(SESSIONS * 4).await;

    // A replica joins under load.
    let joined_at = Instant::now();
    let joining = starter.start();
    holds_share(&store, &joining, REPLICAS + 1).await;
    let join = millis(joined_at.elapsed());
    replicas.push(joining);
    watcher.flowing(SESSIONS * 4).await;

    // Each replica in turn stopped and replaced, under load.
    let mut handovers = Vec::new();
    let mut shares = Vec::new();
    for _ in 0..replicas.len() {
        let leaving = replicas.remove(0);
        if watcher.endpoint == leaving.process.endpoint {
            watcher = watcher.move_to(&replicas[0].process.endpoint);
        }
        let held = leaving.shards(&store).await;
        let stopped_at = Instant::now();
        let pid = leaving.process.pid();
        leaving.process.terminate().await;
        until(
            "a stopping replica's shards found no holder",
            MINUTE,
            || async {
                let leases = store.shard_leases().await.unwrap();
                held.iter()
                    .all(|shard| {
                        leases
                            .iter()
                            .any(|l| l.shard == *shard && l.live && l.holder.pid() != Some(pid))
                    })
                    .then_some(())
            },
        )
        .await;
        handovers.push(millis(stopped_at.elapsed()));
        let mut process = leaving.process;
        process
            .exited_within(Duration::from_secs(30))
            .await
            .expect("a replica stops at SIGTERM");
        let started_at = Instant::now();
        let replacement = starter.start();
        holds_share(&store, &replacement, replicas.len() + 1).await;
        shares.push(millis(started_at.elapsed()));
        replicas.push(replacement);
        watcher.flowing(SESSIONS * 4).await;
    }

    handovers.sort_by(f64::total_cmp);
    shares.sort_by(f64::total_cmp);
    println!(
        "{REPLICAS} replicas, one joining, then all {} restarted one by one; {SESSIONS} agents",
        REPLICAS + 1
    );
    println!();
    println!("| measure | p50 (ms) | max (ms) |");
    println!("|---|---|---|");
    println!("| a joining replica: start to its share held | {join:.0} | {join:.0} |");
    for (name, ms) in [
        ("SIGTERM to every shard it held held by another", &handovers),
        ("a replacement: start to its share held", &shares),
    ] {
        println!(
            "| {name} | {:.0} | {:.0} |",
            percentile(ms, 50.0),
            ms[ms.len() - 1]
        );
    }
    stop_and_count(&replicas[0], &store, watcher, &sessions).await;
    for r in replicas {
        r.process.stop().await;
    }
}

/// Waits until `replica` holds its share of the shards among `live`
/// replicas (the smaller share, when they do not divide evenly).
async fn holds_share(store: &PgStore, replica: &Replica, live: usize) {
    let share = usize::from(SHARDS) / live;
    until("a replica never took its share", MINUTE, || async {
        (replica.shards(store).await.len() >= share).then_some(())
    })
    .await;
}

/// A duration in milliseconds.
fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
