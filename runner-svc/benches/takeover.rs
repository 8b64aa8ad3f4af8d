//! Takeover time: from the SIGKILL of the replica that holds the lease of
//! the sessions' shard to the next output event of its sessions, as a
//! watcher on a replica that stays up receives it; and what a watcher and
//! the database hold of every session's output at the end (lines lost or
//! repeated, counted).
//!
//! Real parts: a PostgreSQL database on the cluster of
//! `TROUPE_TEST_POSTGRES_URL`, `REPLICAS` `troupe-session` processes (the
//! release binary) with `--runner` and otherwise their default flags, one
//! real runner (served in this process, as the takeover test runs it) on
//! the Docker engine of `DOCKER_HOST`. `SESSIONS` agents in one workspace
//! each print a numbered line every 50 ms until a message tells them to
//! stop; then they print `end<N>`, N being their last line, and exit.
//!
//! Each of `BENCH_KILLS` rounds (default 20): wait until every replica
//! answers, the shard is held and output flows; wait a varying delay (so
//! kills fall at every point of the renewal cycle); move the watcher off
//! the holder if it is on it; SIGKILL the holder (known by the pid its
//! holder name carries); take the newest event id
//! once its database connections are gone (a commit it sent before dying
//! may land after its death; every output event after that id is the next
//! owner's); time the shard's next term (polled) and the first output
//! event after that id at the watcher; start a new replica to keep the
//! count.
//!
//! The lease's timing is the binaries' defaults unless `TROUPE_LEASE_TTL_MS`
//! and `TROUPE_LEASE_RENEW_MS` are set in the bench's environment (the
//! replicas inherit them); the bench prints what was in force.
//!
//! ```sh
//! source scripts/pg-env && source scripts/docker-env && scripts/build-image
//! cargo build --release -p troupe-session-svc
//! cargo bench -p troupe-runner-svc --bench takeover
//! ```

#[path = "../tests/common/mod.rs"]
mod common;
mod printers;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use clap::Parser;
use common::{MINUTE, TestRunner, replicas::until};
use printers::{Seen, Starter, Watcher, printer, shard_lease, stop_and_count};
use troupe_session_svc::{
    shard::Shard,
    store::{PgStore, prelude::*},
};
use troupe_tests::bench::percentile;

/// Replicas kept up: the holder and two that may take over from it.
const REPLICAS: usize = 3;
/// Agents printing at once, in one workspace.
const SESSIONS: usize = 4;
fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench());
}

async fn bench() {
    let kills: usize = std::env::var("BENCH_KILLS")
        .ok()
        .map_or(20, |v| v.parse().expect("BENCH_KILLS: a number"));
    // The lease's timing as the replicas will read it: flags' defaults,
    // or the `TROUPE_LEASE_*` variables they inherit from here.
    let timing = troupe_session_svc::Config::try_parse_from(["troupe-session"])
        .expect("the service's configuration from the environment")
        .lease_timing()
        .expect("a valid lease timing");
    println!(
        "lease: ttl {} ms, renewed every {} ms; {REPLICAS} replicas, {SESSIONS} agents, {kills} kills",
        timing.ttl.as_millis(),
        timing.renew_every.as_millis()
    );
    let url = troupe_tests::postgres::fresh_database().await;
    let store = PgStore::open(&url).await.expect("open the database");
    let admin = sqlx::PgPool::connect(&url).await.expect("connect");
    let runner = TestRunner::driven().await;
    let mut starter = Starter::new(&url, &format!("http://{}", runner.addr), "takeover");
    let mut replicas = starter.start_all(REPLICAS).await;
    let workspace = runner.workspace("takeover");
    let shard = Shard::of(&workspace);
    let mut sessions = Vec::new();
    for i in 0..SESSIONS {
        sessions.push(printer(&replicas[0], &workspace, &format!("printer {i}")).await);
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut watcher = Watcher::start(seen.clone(), &workspace, &replicas[0].process.endpoint);

    let mut takeovers = Vec::new();
    let mut leases = Vec::new();
    let mut resumes = Vec::new();
    for round in 0..kills {
        // Steady: every replica answers, the lease is held, output flows.
        for r in &replicas {
            r.process.channel().await;
        }
        let lease = until("nobody holds the shard", MINUTE, || async {
            shard_lease(&store, shard).await.filter(|l| l.live)
        })
        .await;
        watcher.flowing(SESSIONS).await;
        // Kills spread over the renewal cycle.
        let phase = (round as u64 * 7919) % timing.renew_every.as_millis() as u64;
        tokio::time::sleep(Duration::from_millis(500 + phase)).await;
        let lease = shard_lease(&store, shard)
            .await
            .filter(|l| l.live && l.epoch >= lease.epoch)
            .expect("the shard still held");
        let holder = replicas
            .iter()
            .position(|r| lease.holder.pid() == Some(r.process.pid()))
            .expect("the holder is one of the replicas");
        if watcher.endpoint == replicas[holder].process.endpoint {
            let other = &replicas[(holder + 1) % replicas.len()];
            watcher = watcher.move_to(&other.process.endpoint);
        }

        let killed_at = Instant::now();
        let mut killed = replicas.remove(holder);
        killed.process.kill();
        killed
            .process
            .exited_within(Duration::from_secs(10))
            .await
            .expect("the holder dies at SIGKILL");
        // A commit it sent before dying may still land: its connections
        // gone, every output event after the newest is the next owner's.
        until("the killed replica's connections stay", MINUTE, || async {
            let left: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            )
            .bind(&killed.name)
            .fetch_one(&admin)
            .await
            .unwrap();
            (left == 0).then_some(())
        })
        .await;
        let newest = store.event_heads().await.unwrap().newest(shard);
        // Polled every 10 ms, beside the watcher.
        let next_term = tokio::spawn({
            let store = store.clone();
            let old = lease.epoch;
            async move {
                let deadline = Instant::now() + MINUTE;
                loop {
                    let lease = shard_lease(&store, shard).await;
                    if lease.is_some_and(|l| l.live && l.epoch > old) {
                        return Instant::now();
                    }
                    assert!(Instant::now() < deadline, "nobody took over");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        });
        let output_at = until("no output after the kill", MINUTE, || async {
            seen.lock().unwrap().first_output_after(shard, newest)
        })
        .await;
        let lease_at = next_term.await.expect("the lease poller");
        let takeover = millis(output_at - killed_at);
        let leased = millis(lease_at.saturating_duration_since(killed_at));
        let resumed = millis(output_at.saturating_duration_since(lease_at));
        println!(
            "kill {:>2}: lease taken after {leased:>5.0} ms, output after {takeover:>5.0} ms \
             ({resumed:.0} ms after the lease)",
            round + 1
        );
        takeovers.push(takeover);
        leases.push(leased);
        resumes.push(resumed);
        drop(killed);
        replicas.push(starter.start());
    }

    takeovers.sort_by(f64::total_cmp);
    leases.sort_by(f64::total_cmp);
    resumes.sort_by(f64::total_cmp);
    println!();
    println!("| measure | p50 (ms) | p99 (ms) | max (ms) |");
    println!("|---|---|---|---|");
    for (name, ms) in [
        (
            "SIGKILL to the next output event at the watcher",
            &takeovers,
        ),
        ("SIGKILL to the lease's next term (polled)", &leases),
        ("the lease's next term to that output event", &resumes),
    ] {
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} |",
            percentile(ms, 50.0),
            percentile(ms, 99.0),
            ms[ms.len() - 1]
        );
    }
    stop_and_count(&replicas[0], &store, watcher, &sessions).await;
    for r in replicas {
        r.process.stop().await;
    }
}

/// A duration in milliseconds.
fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
