//! Disk use of the pair while one agent prints a great deal: the session
//! service's database (`troupe.db` and its write-ahead log) and the
//! runner's data directory, in blocks on disk, sampled every 100 ms from the session's start
//! until a few seconds after its end (the upkeep returns freed space), with
//! the peak and final sizes of each, against the session service's caps.
//!
//! `TROUPE_BENCH_OUTPUT_BYTES` sets how much the agent prints (default 2 GiB).
//! `cargo bench -p troupe-runner-svc --bench disk` (needs DOCKER_HOST and the
//! image, as the tests do).

#[path = "../tests/common/mod.rs"]
mod common;

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use common::pair::Pair;
use troupe_proto::session::SessionStatus;

const MIB: f64 = (1 << 20) as f64;
/// How long the sizes are still sampled after the session ends.
const SETTLE: Duration = Duration::from_secs(10);

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench());
}

/// Bytes the files under `path` take on disk: their blocks, not their
/// sizes (a log whose head was punched out keeps its size).
fn tree_bytes(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => tree_bytes(&entry.path()),
            Ok(kind) if kind.is_file() => file_bytes(&entry.path()),
            _ => 0,
        })
        .sum()
}

/// Bytes a file takes on disk (its blocks).
fn file_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map_or(0, |m| m.blocks() * 512)
}

/// Peak and latest of one size.
#[derive(Default)]
struct Gauge {
    peak: AtomicU64,
    last: AtomicU64,
}

impl Gauge {
    fn set(&self, bytes: u64) {
        self.peak.fetch_max(bytes, Ordering::Relaxed);
        self.last.store(bytes, Ordering::Relaxed);
    }

    fn show(&self, what: &str) {
        println!(
            "{what:<34} peak {:>9.1} MiB   final {:>9.1} MiB",
            self.peak.load(Ordering::Relaxed) as f64 / MIB,
            self.last.load(Ordering::Relaxed) as f64 / MIB,
        );
    }
}

async fn bench() {
    let bytes: u64 = std::env::var("TROUPE_BENCH_OUTPUT_BYTES")
        .ok()
        .map(|v| {
            v.parse()
                .expect("TROUPE_BENCH_OUTPUT_BYTES: a number of bytes")
        })
        .unwrap_or(2 << 30);
    let pair = Pair::start().await;
    let ws = pair.runner.workspace("disk");
    pair.agent(
        &ws,
        "flood",
        &format!("yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c {bytes}"),
    );
    let db = pair.server.config.data_dir.join("troupe.db");
    let wal = pair.server.config.data_dir.join("troupe.db-wal");
    let runner_dir = pair.runner.config.data_dir.clone();

    let (database, log, runner) = (
        Arc::new(Gauge::default()),
        Arc::new(Gauge::default()),
        Arc::new(Gauge::default()),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = std::thread::spawn({
        let (database, log, runner, stop) =
            (database.clone(), log.clone(), runner.clone(), stop.clone());
        move || {
            while !stop.load(Ordering::Relaxed) {
                let (d, w) = (file_bytes(&db), file_bytes(&wal));
                database.set(d + w);
                log.set(w);
                runner.set(tree_bytes(&runner_dir));
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    });

    let started = Instant::now();
    let root = pair.root(&ws, "flood", "go").await;
    let deadline = started + Duration::from_secs(3600);
    let done = loop {
        let got = pair.get(&root.session_id).await;
        let status = got.session.as_ref().unwrap().status();
        if status != SessionStatus::Pending && status != SessionStatus::Running {
            break got;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not finish within an hour"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let elapsed = started.elapsed();
    tokio::time::sleep(SETTLE).await;
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();

    let config = &pair.server.config;
    let session = done.session.unwrap();
    println!(
        "one agent printed {:.1} MiB in {:.1} s ({:.1} MiB/s), status {:?}",
        bytes as f64 / MIB,
        elapsed.as_secs_f64(),
        bytes as f64 / MIB / elapsed.as_secs_f64(),
        session.status()
    );
    database.show("session service: troupe.db + wal");
    log.show("session service: troupe.db-wal");
    runner.show("runner: data directory");
    println!(
        "caps: output events {:.1} MiB per session, {:.1} MiB in all (about 4/3 of it on \
         disk, as base64); write-ahead log {:.1} MiB and one write; sampled for {} s after the end",
        config.output_session_bytes as f64 / MIB,
        config.output_total_bytes as f64 / MIB,
        troupe_session_svc::store::WAL_LIMIT as f64 / MIB,
        SETTLE.as_secs(),
    );
    let runner = &pair.runner.config;
    println!(
        "runner caps: a log {} MiB ({:?}), all logs {} MiB, output window {} KiB",
        runner.exec_log_max_mib,
        runner.exec_log_policy,
        runner.logs_max_mib,
        runner.output_window_kib,
    );
}
