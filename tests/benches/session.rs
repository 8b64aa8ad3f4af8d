//! Latency of the session service over gRPC on loopback, SQLite default:
//! CreateSession, SendMessage, and ListWorkspaceSessions with 100, 1,000 and
//! 10,000 sessions in the workspace, and the floors under them: a gRPC call
//! that does no work, and one SQL statement's round trip through sqlx. Prints p50/p99 per call as a Markdown
//! table (the figures in BENCHMARKS.md).
//!
//! Run: `cargo bench -p troupe-tests --bench session`

use std::time::Instant;

use troupe_proto::session::{self as pb, TrustLevel};
use troupe_tests::{
    Client, TestServer,
    bench::{measure, ms, percentile, unlimited},
    child,
};

const SAMPLES: usize = 1000;
const LIST_SAMPLES: usize = 100;

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
    let server = TestServer::start_with(unlimited).await;
    let mut rows = Vec::new();
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
        let (p50, p99) = measure(SAMPLES, |i| {
            let mut c = spawners[i / CHILDREN_PER_ROOT].clone();
            async move {
                c.create_session(child(&format!("child {i}")))
                    .await
                    .expect("create");
            }
        })
        .await;
        eprintln!("create: p50 {} ms", ms(p50));
        rows.push(("CreateSession".to_owned(), p50, p99));
    }

    if wanted("message") {
        let (target, sender, _) = server.root("bench-message", TrustLevel::Direct).await;
        let (p50, p99) = measure(SAMPLES, |i| {
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
        })
        .await;
        rows.push(("SendMessage".to_owned(), p50, p99));
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
        let (p50, p99) = measure(LIST_SAMPLES, |_| {
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
        })
        .await;
        eprintln!("list of {count}: p50 {} ms", ms(p50));
        rows.push((
            format!("ListWorkspaceSessions ({count} sessions)"),
            p50,
            p99,
        ));
    }

    if wanted("floor") {
        // The floor of a call: a gRPC health check, which does no work, on
        // the same kind of connection as the calls above.
        use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
        let channel = troupe_proto::endpoint::connect(&format!("http://{}", server.addr))
            .await
            .expect("connect");
        let health = HealthClient::new(channel);
        let (p50, p99) = measure(SAMPLES, |_| {
            let mut h = health.clone();
            async move {
                h.check(HealthCheckRequest::default())
                    .await
                    .expect("health");
            }
        })
        .await;
        rows.push(("gRPC health check (no work)".to_owned(), p50, p99));

        // The floor under every call: one statement's round trip to the
        // SQLite driver's worker thread, on a connection of the same database.
        use sqlx::Connection;
        let url = server.config.database_url();
        let mut conn = sqlx::SqliteConnection::connect(&url)
            .await
            .expect("connect");
        let mut times = Vec::with_capacity(SAMPLES);
        for i in 0..SAMPLES + SAMPLES / 10 {
            let start = Instant::now();
            let one: i64 = sqlx::query_scalar("SELECT 1")
                .fetch_one(&mut conn)
                .await
                .expect("select");
            assert_eq!(one, 1);
            if i >= SAMPLES / 10 {
                times.push(start.elapsed());
            }
        }
        times.sort();
        rows.push((
            "one SQL statement (SELECT 1, sqlx, held connection)".to_owned(),
            percentile(&times, 50.0),
            percentile(&times, 99.0),
        ));
    }

    println!("| call | samples | p50 (ms) | p99 (ms) |");
    println!("|---|---|---|---|");
    for (name, p50, p99) in rows {
        let samples = if name.starts_with("List") {
            LIST_SAMPLES
        } else {
            SAMPLES
        };
        println!("| {name} | {samples} | {} | {} |", ms(p50), ms(p99));
    }
    server.stop().await;
}
