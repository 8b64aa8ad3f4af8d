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

use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use clap::Parser;
use common::{
    MINUTE, TestRunner,
    replicas::{binary, output, until},
};
use futures::StreamExt;
use troupe_proto::session::{
    CreateRootSessionRequest, EventKind, SessionStatus, TrustLevel, WatchSessionsRequest,
    session_event::Detail,
};
use troupe_session_svc::{
    cursor::Cursor,
    shard::Shard,
    store::{Lease, PgStore, prelude::*},
};
use troupe_tests::{OPERATOR_TOKEN, bench::percentile, process::SessionProcess};

/// Replicas kept up: the holder and two that may take over from it.
const REPLICAS: usize = 3;
/// Agents printing at once, in one workspace.
const SESSIONS: usize = 4;
/// The message that ends an agent's printing.
const STOP: &str = "stop-printing";

/// Each agent: a printer in the background (a line every 50 ms; on
/// SIGTERM it finishes its line, prints `end<N>` and exits), and the shell
/// reading its stdin until the stop message.
const PRINTER: &str = "( stop=0; trap 'stop=1' TERM; i=0; \
    while [ $stop = 0 ]; do i=$((i+1)); echo line$i; sleep 0.05; done; echo end$i ) & \
    printer=$!; \
    while read -r l; do case \"$l\" in *stop-printing*) kill -TERM $printer; wait $printer; exit 0;; esac; done";

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
    let runner_endpoint = format!("http://{}", runner.addr);
    let logs = tempfile::tempdir().unwrap();
    let mut started = 0;
    let mut start_replica = || {
        started += 1;
        Replica::start(
            &url,
            &runner_endpoint,
            &format!("takeover-r{started}"),
            logs.path(),
        )
    };
    let mut replicas: Vec<Replica> = (0..REPLICAS).map(|_| start_replica()).collect();
    for r in &replicas {
        r.process.channel().await;
    }
    let workspace = runner.workspace("takeover");
    let shard = Shard::of(&workspace);
    let mut creator = replicas[0].process.operator().await;
    let mut sessions = Vec::new();
    for i in 0..SESSIONS {
        let created = creator
            .create_root_session(CreateRootSessionRequest {
                workspace_id: workspace.clone(),
                trust_level: TrustLevel::Direct as i32,
                title: format!("printer {i}"),
                agent_name: "printer".into(),
                initial_message: "go".into(),
                request_id: String::new(),
                budget: None,
                writable_paths: Vec::new(),
            })
            .await
            .expect("create a printer")
            .into_inner();
        sessions.push(created.session.expect("a session").session_id);
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
        let flowing_after = seen.lock().unwrap().outputs.len();
        until("no output flows", MINUTE, || async {
            (seen.lock().unwrap().outputs.len() > flowing_after + SESSIONS).then_some(())
        })
        .await;
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
            seen.lock().unwrap().first_output_after(newest)
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
        replicas.push(start_replica());
    }

    // The end: every agent told to stop, then all its output checked.
    let mut operator = replicas[0].process.operator().await;
    for id in &sessions {
        operator
            .send_message(troupe_tests::message(id, STOP))
            .await
            .expect("send the stop message");
    }
    for id in &sessions {
        until("a printer did not complete", MINUTE, || async {
            let status = troupe_tests::get(id);
            let session = operator.clone().get_session(status).await.ok()?;
            (session.into_inner().session?.status() == SessionStatus::Completed).then_some(())
        })
        .await;
        until(
            "the watcher did not see a printer's end",
            MINUTE,
            || async { seen.lock().unwrap().ended(id).then_some(()) },
        )
        .await;
    }
    let mut watched = Count::default();
    let mut stored = Count::default();
    for id in &sessions {
        let text = String::from_utf8_lossy(&seen.lock().unwrap().bytes[id]).into_owned();
        watched.add(&lines(&text));
        stored.add(&lines(&output(&store, id).await));
    }
    watcher.task.abort();

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
    println!();
    println!("| output | lines | lost | repeated |");
    println!("|---|---|---|---|");
    for (name, count) in [("at the watcher", &watched), ("in the database", &stored)] {
        println!(
            "| {name} | {} | {} | {} |",
            count.lines, count.lost, count.repeated
        );
    }
    for r in replicas {
        r.process.stop().await;
    }
}

/// A `troupe-session` process with default flags but `--runner`, its log
/// in a file.
struct Replica {
    process: SessionProcess,
    /// Its connections' `application_name`.
    name: String,
}

impl Replica {
    fn start(url: &str, runner: &str, name: &str, logs: &Path) -> Replica {
        let sep = if url.contains('?') { '&' } else { '?' };
        let url = format!("{url}{sep}application_name={name}");
        let log = logs.join(format!("{name}.log"));
        let dir = tempfile::tempdir().unwrap();
        let agents = dir.path().join("data/agents");
        std::fs::create_dir_all(&agents).unwrap();
        let command = serde_json::to_string(&["sh", "-c", PRINTER]).unwrap();
        std::fs::write(
            agents.join("printer.md"),
            format!(
                "---\nname: printer\ndescription: prints numbered lines\ncommand: {command}\n---\n"
            ),
        )
        .unwrap();
        let process = SessionProcess::start_logging(
            &binary(),
            dir,
            &["--database-url", &url, "--runner", runner],
            &[],
            Some(&log),
        );
        Replica {
            process,
            name: name.to_owned(),
        }
    }
}

/// The lease of `shard` as it stands.
async fn shard_lease(store: &PgStore, shard: Shard) -> Option<Lease> {
    let leases = store.shard_leases().await.unwrap();
    leases.into_iter().find(|l| l.shard == shard)
}

/// A duration in milliseconds.
fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// What the watcher received: each session's output bytes, and when each
/// output event arrived.
#[derive(Default)]
struct Seen {
    cursor: String,
    bytes: HashMap<String, Vec<u8>>,
    /// (position in the shard, arrival) of every output event, in order.
    outputs: Vec<(i64, Instant)>,
    completed: Vec<String>,
}

impl Seen {
    fn first_output_after(&self, position: i64) -> Option<Instant> {
        self.outputs
            .iter()
            .find(|(p, _)| *p > position)
            .map(|(_, at)| *at)
    }

    fn ended(&self, id: &str) -> bool {
        self.completed.iter().any(|c| c == id)
    }
}

/// A `WatchSessions` of the workspace on one replica, resumed from the
/// last cursor it received when moved to another.
struct Watcher {
    endpoint: String,
    task: tokio::task::JoinHandle<()>,
    seen: Arc<Mutex<Seen>>,
    workspace: String,
}

impl Watcher {
    fn start(seen: Arc<Mutex<Seen>>, workspace: &str, endpoint: &str) -> Watcher {
        let task = tokio::spawn(watch(
            seen.clone(),
            workspace.to_owned(),
            endpoint.to_owned(),
        ));
        Watcher {
            endpoint: endpoint.to_owned(),
            task,
            seen,
            workspace: workspace.to_owned(),
        }
    }

    /// The same watch on `endpoint`, from where this one was.
    fn move_to(self, endpoint: &str) -> Watcher {
        self.task.abort();
        Watcher::start(self.seen, &self.workspace, endpoint)
    }
}

/// Watches `workspace` on `endpoint` from the last cursor seen, again after
/// any interruption.
async fn watch(seen: Arc<Mutex<Seen>>, workspace: String, endpoint: String) {
    let channel = troupe_proto::endpoint::connect(&endpoint)
        .await
        .expect("connect the watcher");
    let mut client =
        troupe_proto::session::session_service_client::SessionServiceClient::with_interceptor(
            channel,
            troupe_proto::endpoint::Bearer::new(Some(OPERATOR_TOKEN)).unwrap(),
        );
    loop {
        let after = seen.lock().unwrap().cursor.clone();
        let request = WatchSessionsRequest {
            workspace_id: workspace.clone(),
            after,
            ..Default::default()
        };
        if let Ok(stream) = client.watch_sessions(request).await {
            let mut stream = stream.into_inner();
            while let Some(Ok(event)) = stream.next().await {
                let at = Instant::now();
                let mut seen = seen.lock().unwrap();
                let cursor: Cursor = event.cursor.parse().expect("a cursor");
                let position = cursor.after(Shard::of(&workspace));
                seen.cursor = event.cursor.clone();
                match (event.kind(), &event.detail) {
                    (EventKind::Output, Some(Detail::Output(out))) => {
                        seen.outputs.push((position, at));
                        seen.bytes
                            .entry(event.session_id.clone())
                            .or_default()
                            .extend_from_slice(&out.data);
                    }
                    (EventKind::Completed, _) => seen.completed.push(event.session_id.clone()),
                    _ => {}
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One session's numbered lines: how many times each number appears, and
/// the last one, from its `end<N>`.
fn lines(text: &str) -> (HashMap<u64, u64>, Option<u64>) {
    let mut counts = HashMap::new();
    let mut last = None;
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("line").and_then(|n| n.parse().ok()) {
            *counts.entry(n).or_insert(0) += 1;
        } else if let Some(n) = line.strip_prefix("end").and_then(|n| n.parse().ok()) {
            last = Some(n);
        }
    }
    (counts, last)
}

/// Lines printed, lost (a number from 1 to the last one that never came,
/// or the `end` line itself missing) and repeated (every copy beyond the
/// first, of any line).
#[derive(Default)]
struct Count {
    lines: u64,
    lost: u64,
    repeated: u64,
}

impl Count {
    fn add(&mut self, (counts, last): &(HashMap<u64, u64>, Option<u64>)) {
        let last = last.unwrap_or_else(|| {
            self.lost += 1;
            counts.keys().copied().max().unwrap_or(0)
        });
        self.lines += last;
        self.lost += (1..=last).filter(|n| !counts.contains_key(n)).count() as u64;
        // Numbers past the end are repeats of nothing: they count as repeated.
        self.repeated += counts
            .iter()
            .map(|(n, c)| if *n > last { *c } else { c - 1 })
            .sum::<u64>();
    }
}
