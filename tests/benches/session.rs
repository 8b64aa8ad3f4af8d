//! Latency of the session service over gRPC on loopback, on SQLite (the
//! default) and, when `TROUPE_TEST_POSTGRES_URL` names a server
//! (`source scripts/pg-env`), on PostgreSQL in the same run, one replica:
//! CreateSession, SendMessage, and ListWorkspaceSessions with 100, 1,000 and
//! 10,000 sessions in the workspace, and the floors under them: a gRPC call
//! that does no work, and one SQL statement's round trip through sqlx. Each
//! measured call is followed by a timed no-op call (a gRPC health check), so
//! every row also says what the machine did to a call that does no work at
//! the same moments. Prints p50/p99 per call and backend as a Markdown table
//! (the figures in BENCHMARKS.md). `BENCH_BACKENDS=sqlite` (or `postgres`)
//! runs one backend only.
//!
//! Run: `cargo bench -p troupe-tests --bench session`

use std::time::{Duration, Instant};

use sqlx::Connection;

use troupe_proto::session::{self as pb, TrustLevel};
use troupe_tests::{
    Client, TestServer,
    bench::{Noop, measure, measure_beside, ms, percentile, unlimited},
    child,
    postgres::{self, Backend},
};

/// The allocator the `troupe-session` binary runs on.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SAMPLES: usize = 5000;
/// Lists of 100 and 1,000 sessions; 10,000 take a tenth (each is ~25 ms).
const LIST_SAMPLES: usize = 1000;

/// A p50 and a p99.
type Pair = (Duration, Duration);
/// One row of the table: the call, its samples, its p50 and p99, and the
/// same for the no-op calls interleaved with it.
type Row = (String, usize, Pair, Option<Pair>);

/// This process's resident memory, in KiB.
fn rss_kib() -> i64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

async fn seed(server: &TestServer, workspace: &str, count: usize) -> Client {
    let (_, client, _) = server.root(workspace, TrustLevel::Direct).await;
    let mut op = server.operator().await;
    for _ in 1..count {
        op.create_root_session(pb::CreateRootSessionRequest {
            workspace_id: workspace.into(),
            trust_level: TrustLevel::Direct as i32,
            agent_name: "worker".into(),
            title: "seeded".into(),
            ..Default::default()
        })
        .await
        .expect("seed");
    }
    client
}

#[tokio::main]
async fn main() {
    // As `troupe-session` does (its `small_pages`).
    let _ = nix::sys::prctl::set_thp_disable(true);
    let backends = match std::env::var("BENCH_BACKENDS") {
        Ok(list) => list.split(',').map(|b| Backend::parse(Some(b))).collect(),
        Err(_) if std::env::var(postgres::URL_ENV).is_ok() => {
            vec![Backend::Sqlite, Backend::Postgres]
        }
        Err(_) => {
            eprintln!(
                "{} is not set: SQLite only (`source scripts/pg-env` for PostgreSQL too)",
                postgres::URL_ENV
            );
            vec![Backend::Sqlite]
        }
    };
    let mut tables = Vec::new();
    for backend in backends {
        tables.push((backend, run(backend).await));
    }
    println!("| backend | call | samples | p50 (ms) | p99 (ms) | no-op between, p50 / p99 (ms) |");
    println!("|---|---|---|---|---|---|");
    for (backend, rows) in tables {
        let backend = match backend {
            Backend::Sqlite => "SQLite",
            Backend::Postgres => "PostgreSQL",
        };
        for (name, samples, (p50, p99), floor) in rows {
            let floor = floor.map_or("".to_owned(), |(p50, p99)| {
                format!("{} / {}", ms(p50), ms(p99))
            });
            println!(
                "| {backend} | {name} | {samples} | {} | {} | {floor} |",
                ms(p50),
                ms(p99)
            );
        }
    }
}

/// Times `SELECT 1` on a connection (`$conn`, a `Result` of connecting),
/// after a tenth as many unmeasured; the times sorted. A macro, as the two
/// backends' connections share no trait that sqlx's statements accept.
macro_rules! select_one {
    ($conn:expr) => {{
        let mut conn = $conn.expect("connect");
        let mut times = Vec::with_capacity(SAMPLES);
        for i in 0..SAMPLES + SAMPLES / 10 {
            let start = Instant::now();
            let one: i32 = sqlx::query_scalar("SELECT 1")
                .fetch_one(&mut conn)
                .await
                .expect("select");
            assert_eq!(one, 1);
            if i >= SAMPLES / 10 {
                times.push(start.elapsed());
            }
        }
        times.sort();
        times
    }};
}

/// Measures every part on a server on `backend`.
async fn run(backend: Backend) -> Vec<Row> {
    eprintln!("backend: {backend:?}");
    let server = TestServer::start_on(backend, unlimited).await;
    let mut rows: Vec<Row> = Vec::new();
    // A call that does no work, on the same kind of connection as the calls.
    let noop = &Noop::connect(server.addr).await;
    let noop = || noop.call();
    // `BENCH_ONLY=list,floor` (parts: create, message, list, floor) runs some parts, for profiling.
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let wanted = |part: &str| only.is_empty() || only.split(',').any(|p| p == part);

    if wanted("create") {
        // Trees of the default shape: each root spawns CHILDREN_PER_ROOT
        // children (fewer than the default tree quota of 10), all in one
        // workspace that grows to about 1,250 sessions.
        const CHILDREN_PER_ROOT: usize = 8;
        let mut spawners = Vec::new();
        for _ in 0..(SAMPLES + SAMPLES / 10).div_ceil(CHILDREN_PER_ROOT) {
            spawners.push(server.root("bench-create", TrustLevel::Direct).await.1);
        }
        let (call, floor) = measure_beside(
            SAMPLES,
            |i| {
                let mut c = spawners[i / CHILDREN_PER_ROOT].clone();
                async move {
                    c.create_session(child(&format!("child {i}")))
                        .await
                        .expect("create");
                }
            },
            noop,
        )
        .await;
        eprintln!("create: p50 {} ms", ms(call.0));
        rows.push(("CreateSession".to_owned(), SAMPLES, call, Some(floor)));
    }

    if wanted("message") {
        let (target, sender, _) = server.root("bench-message", TrustLevel::Direct).await;
        let (call, floor) = measure_beside(
            SAMPLES,
            |i| {
                let mut c = sender.clone();
                let id = target.session_id.clone();
                async move {
                    c.send_message(pb::SendMessageRequest {
                        session_id: id,
                        message: format!("message {i}"),
                        request_id: String::new(),
                    })
                    .await
                    .expect("send");
                }
            },
            noop,
        )
        .await;
        rows.push(("SendMessage".to_owned(), SAMPLES, call, Some(floor)));
    }

    for count in [100usize, 1_000, 10_000]
        .into_iter()
        .filter(|_| wanted("list"))
    {
        let workspace = format!("bench-list-{count}");
        let rss_before = rss_kib();
        let lister = seed(&server, &workspace, count).await;
        if count == 10_000 {
            // An upper bound of what the ledger holds per session: the whole
            // process's growth (SQLite's caches and the allocator's slack too).
            eprintln!(
                "memory: {:.0} bytes of resident growth per seeded session",
                (rss_kib() - rss_before) as f64 * 1024.0 / count as f64
            );
        }
        let samples = if count == 10_000 {
            LIST_SAMPLES / 10
        } else {
            LIST_SAMPLES
        };
        let (call, floor) = measure_beside(
            samples,
            |_| {
                let mut c = lister.clone();
                async move {
                    let listed = c
                        .list_workspace_sessions(pb::ListWorkspaceSessionsRequest {
                            page_size: 10_000,
                            ..Default::default()
                        })
                        .await
                        .expect("list")
                        .into_inner()
                        .sessions
                        .len();
                    assert_eq!(listed, count);
                }
            },
            noop,
        )
        .await;
        eprintln!("list of {count}: p50 {} ms", ms(call.0));
        rows.push((
            format!("ListWorkspaceSessions ({count} sessions)"),
            samples,
            call,
            Some(floor),
        ));
    }

    if wanted("floor") {
        // The floor of a call on its own: the health check, back to back.
        let pair = measure(SAMPLES, |_| noop()).await;
        rows.push((
            "gRPC health check (no work)".to_owned(),
            SAMPLES,
            pair,
            None,
        ));

        // The floor under every call: one statement's round trip through
        // sqlx, on a connection of the same database (to the SQLite driver's
        // worker thread, or to the PostgreSQL server over loopback).
        let url = server.config.database_url();
        let times = match backend {
            Backend::Sqlite => select_one!(sqlx::SqliteConnection::connect(&url).await),
            Backend::Postgres => select_one!(sqlx::PgConnection::connect(&url).await),
        };
        rows.push((
            "one SQL statement (SELECT 1, sqlx, held connection)".to_owned(),
            SAMPLES,
            (percentile(&times, 50.0), percentile(&times, 99.0)),
            None,
        ));
    }
    server.stop().await;
    rows
}
