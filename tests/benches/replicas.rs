//! Spawns per second at saturation on PostgreSQL with 1, 2 and 3 session
//! service replicas on one database, every quota on at its default (depth,
//! tree, children, workspace active, spawn rate), so each spawn takes the
//! locks and checks it takes in production; only admitted spawns count.
//!
//! Each of `WORKERS` clients, spread over the replicas, repeats: an
//! operator's root session in its workspace, then `BURST` children created
//! by that root (the default rate's burst, so none is refused), moving to a
//! fresh workspace before the workspace's active quota would refuse. The
//! figure is children created per second of wall time, over `SECONDS`,
//! after a warm-up, and the roots beside them.
//!
//! Run: `source scripts/pg-env && cargo bench -p troupe-tests --bench replicas`

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use troupe_proto::session::{self as pb, TrustLevel, session_service_client::SessionServiceClient};
use troupe_session_svc::Limits;
use troupe_tests::{
    Bearer, OPERATOR_TOKEN, TestServer, child,
    postgres::{Backend, admin_url},
};

/// The allocator the `troupe-session` binary runs on.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Concurrent clients: enough to keep three replicas busy on two cores.
const WORKERS: usize = 48;
/// Children each root creates: the default spawn burst.
const BURST: usize = 3;
/// Trees a worker starts in one workspace before moving on: (1 + BURST)
/// active sessions each, under the default 100 active per workspace.
const TREES_PER_WORKSPACE: usize = 20;
const WARMUP: Duration = Duration::from_secs(3);
const SECONDS: u64 = 15;

#[tokio::main]
async fn main() {
    let _ = nix::sys::prctl::set_thp_disable(true);
    admin_url(); // a clear message if no PostgreSQL is set
    println!("| replicas | spawns/s (children) | roots/s | refused |");
    println!("|---|---|---|---|");
    for replicas in 1..=3 {
        let (children, roots, refused) = saturate(replicas).await;
        println!("| {replicas} | {children:.0} | {roots:.0} | {refused} |");
    }
}

/// Runs the workers against `replicas` servers on one fresh database;
/// returns children/s, roots/s and how many creates were refused.
async fn saturate(replicas: usize) -> (f64, f64, u64) {
    let first = TestServer::start_on(Backend::Postgres, |c| c.limits = Limits::default()).await;
    let mut servers = vec![first];
    for _ in 1..replicas {
        let replica = servers[0].replica().await;
        servers.push(replica);
    }
    let counting = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let children = Arc::new(AtomicU64::new(0));
    let roots = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for worker in 0..WORKERS {
        let server = &servers[worker % replicas];
        // One connection per worker, as an agent's bridge keeps one.
        let channel = troupe_proto::endpoint::connect(&format!("http://{}", server.addr))
            .await
            .expect("connect");
        let as_token = move |token: &str| {
            SessionServiceClient::with_interceptor(
                channel.clone(),
                Bearer::new(Some(token)).expect("ascii token"),
            )
        };
        let mut op = as_token(OPERATOR_TOKEN);
        let (counting, stop) = (counting.clone(), stop.clone());
        let (children, roots, refused) = (children.clone(), roots.clone(), refused.clone());
        tasks.push(tokio::spawn(async move {
            let mut tree = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let workspace = format!("w{worker}-{}", tree / TREES_PER_WORKSPACE);
                tree += 1;
                let root = op
                    .create_root_session(pb::CreateRootSessionRequest {
                        workspace_id: workspace,
                        trust_level: TrustLevel::Direct as i32,
                        title: "root".into(),
                        agent_name: "worker".into(),
                        ..Default::default()
                    })
                    .await
                    .expect("root")
                    .into_inner();
                let counted = counting.load(Ordering::Relaxed);
                roots.fetch_add(u64::from(counted), Ordering::Relaxed);
                let mut as_root = as_token(&root.session_token);
                for i in 0..BURST {
                    match as_root.create_session(child(&format!("c{i}"))).await {
                        Ok(_) => children.fetch_add(u64::from(counted), Ordering::Relaxed),
                        Err(_) => refused.fetch_add(1, Ordering::Relaxed),
                    };
                }
            }
        }));
    }
    tokio::time::sleep(WARMUP).await;
    counting.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(SECONDS)).await;
    counting.store(false, Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("worker");
    }
    for server in servers {
        server.stop().await;
    }
    (
        children.load(Ordering::Relaxed) as f64 / elapsed,
        roots.load(Ordering::Relaxed) as f64 / elapsed,
        refused.load(Ordering::Relaxed),
    )
}
