//! Scale-out on one machine: how spawns, message deliveries and agent
//! output grow with the session service's replicas when each replica, not
//! the machine, is the limit.
//!
//! Real parts: a PostgreSQL database on the cluster of
//! `TROUPE_TEST_POSTGRES_URL` (left unconfined; its CPU is reported), `N`
//! `troupe-session` processes (the release binary, default flags) each
//! confined to a CPU quota by the cgroup v1 `cpu` controller
//! (`/sys/fs/cgroup/cpu`, as root: `cpu.cfs_quota_us`, default 25000 of
//! 100000, a quarter of a CPU), and for the agents one real runner (served
//! in this process) on the Docker engine of `DOCKER_HOST`. For each `N` of
//! `TROUPE_BENCH_REPLICAS` (default `1,2,4`), on a fresh database, once the
//! replicas have divided the shards:
//!
//! - **spawns**: 48 clients spread over the replicas, each an operator's
//!   root then its 3 children (the default burst), again and again, every
//!   quota at its default; children created per second (no runner: nothing
//!   is started).
//! - **messages**: 16 agents (`cat`, one per workspace, so the shards
//!   divide them) and 32 operator clients sending them short messages
//!   through the replicas; messages written to the agents' stdin per second
//!   (the sum of `processes.delivered_seq`).
//! - **output**: 16 agents each printing numbered lines, ten at a time
//!   every 10 ms (more than one replica stores); output events and lines
//!   stored per second.
//!
//! Each figure is counted over `TROUPE_BENCH_SECONDS` (default 10) after a
//! warm-up of 3 s. Beside each: the replicas' CPU (their quota is the
//! ceiling) and PostgreSQL's, in cores.
//!
//! ```sh
//! source scripts/pg-env && source scripts/docker-env && scripts/build-image
//! cargo build --release -p troupe-session-svc
//! sudo -E cargo bench -p troupe-runner-svc --bench scale   # root: the cgroups
//! ```

#[path = "../tests/common/mod.rs"]
mod common;

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use common::{
    MINUTE, TestRunner,
    replicas::{balanced, binary, until},
};
use sqlx::PgPool;
use troupe_proto::session::{self as pb, TrustLevel, session_service_client::SessionServiceClient};
use troupe_session_svc::store::PgStore;
use troupe_tests::{Bearer, OPERATOR_TOKEN, child, process::SessionProcess};

const WARMUP: Duration = Duration::from_secs(3);
/// Spawn clients, and children per root (the default spawn burst).
const SPAWNERS: usize = 48;
const BURST: usize = 3;
/// Trees a spawner starts in one workspace before it moves on.
const TREES_PER_WORKSPACE: usize = 20;
/// Agents of the message and output workloads, one per workspace.
const AGENTS: usize = 16;
const SENDERS: usize = 32;
const PRINTER: &str = "i=0; while :; do for _ in 0 1 2 3 4 5 6 7 8 9; do i=$((i+1)); echo line$i; \
     done; sleep 0.01; done";

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench());
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .map_or(default, |v| v.parse().ok().expect(name))
}

async fn bench() {
    let quota: u64 = env_or("TROUPE_BENCH_REPLICA_CPU_US", 25_000);
    let seconds: u64 = env_or("TROUPE_BENCH_SECONDS", 10);
    let counts: Vec<usize> = std::env::var("TROUPE_BENCH_REPLICAS")
        .unwrap_or_else(|_| "1,2,4".into())
        .split(',')
        .map(|n| n.trim().parse().expect("TROUPE_BENCH_REPLICAS: numbers"))
        .collect();
    let window = Duration::from_secs(seconds);
    println!(
        "each replica confined to {:.2} CPU; {seconds} s counted after {} s",
        quota as f64 / 100_000.0,
        WARMUP.as_secs()
    );
    let runner = TestRunner::driven().await;
    let endpoint = format!("http://{}", runner.addr);
    let workspaces: Vec<String> = (0..AGENTS)
        .map(|i| runner.workspace(&format!("scale{i}")))
        .collect();
    println!("| replicas | workload | per second | replicas' CPU | PostgreSQL CPU |");
    println!("|---|---|---|---|---|");
    for &n in &counts {
        let (rate, cpu) = spawns(n, quota, window).await;
        println!(
            "| {n} | spawns (children) | {rate:.0} | {:.2} | {:.2} |",
            cpu.0, cpu.1
        );
        let (rate, cpu) = messages(n, quota, window, &endpoint, &workspaces).await;
        println!(
            "| {n} | messages delivered | {rate:.0} | {:.2} | {:.2} |",
            cpu.0, cpu.1
        );
        let ((events, lines), cpu) = output(n, quota, window, &endpoint, &workspaces).await;
        println!(
            "| {n} | output events (lines) | {events:.0} ({lines:.0}) | {:.2} | {:.2} |",
            cpu.0, cpu.1
        );
    }
}

/// A replica confined to a CPU quota: its process in a cgroup of its own.
struct Confined {
    process: SessionProcess,
    group: PathBuf,
}

impl Confined {
    fn start(url: &str, runner: Option<&str>, quota: u64, name: &str) -> Confined {
        let dir = tempfile::tempdir().unwrap();
        let agents = dir.path().join("data/agents");
        std::fs::create_dir_all(&agents).unwrap();
        for (agent, script) in [
            ("worker", "cat"),
            ("sink", "cat >/dev/null"),
            ("printer", PRINTER),
        ] {
            let command = serde_json::to_string(&["sh", "-c", script]).unwrap();
            std::fs::write(
                agents.join(format!("{agent}.md")),
                format!(
                    "---\nname: {agent}\ndescription: a bench agent\ncommand: {command}\n---\n"
                ),
            )
            .unwrap();
        }
        let mut flags = vec!["--database-url", url];
        if let Some(runner) = runner {
            flags.extend(["--runner", runner]);
        }
        let process = SessionProcess::start_logging(&binary(), dir, &flags, &[], None);
        let group = PathBuf::from(format!(
            "/sys/fs/cgroup/cpu/troupe-scale-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&group).expect("a cgroup (run as root)");
        std::fs::write(group.join("cpu.cfs_period_us"), "100000").unwrap();
        std::fs::write(group.join("cpu.cfs_quota_us"), quota.to_string()).unwrap();
        std::fs::write(group.join("cgroup.procs"), process.pid().to_string()).unwrap();
        Confined { process, group }
    }
}

impl Drop for Confined {
    fn drop(&mut self) {
        self.process.kill();
        // Emptied once the process is gone.
        for _ in 0..100 {
            if std::fs::remove_dir(&self.group).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `n` confined replicas on a fresh database, once they divided the shards.
async fn fleet(n: usize, quota: u64, runner: Option<&str>) -> (Vec<Confined>, PgStore, PgPool) {
    let url = troupe_tests::postgres::fresh_database().await;
    let store = PgStore::open(&url).await.unwrap();
    let pool = PgPool::connect(&url).await.unwrap();
    let replicas: Vec<Confined> = (0..n)
        .map(|i| Confined::start(&url, runner, quota, &i.to_string()))
        .collect();
    for r in &replicas {
        r.process.channel().await;
    }
    balanced(&store, n).await;
    (replicas, store, pool)
}

/// CPU of the replicas and of PostgreSQL's processes, in seconds.
fn cpu(replicas: &[Confined]) -> (f64, f64) {
    let ours: f64 = replicas
        .iter()
        .map(|r| r.process.cpu_time().as_secs_f64())
        .sum();
    (ours, postgres_cpu())
}

/// The CPU time of every process named `postgres`, in seconds.
fn postgres_cpu() -> f64 {
    let tick = 100.0; // USER_HZ
    let mut total = 0.0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((name, rest)) = stat.split_once(") ") else {
            continue;
        };
        if !name.ends_with("(postgres") {
            continue;
        }
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime: fields 14 and 15 of stat, 12 and 13 after `) `.
        let ticks: f64 =
            fields[11].parse::<f64>().unwrap_or(0.0) + fields[12].parse::<f64>().unwrap_or(0.0);
        total += ticks / tick;
    }
    total
}

/// Counts what `measure` reads over the window after the warm-up; returns
/// it per second, with the replicas' and PostgreSQL's cores meanwhile.
async fn window<F, Fut>(replicas: &[Confined], window: Duration, measure: F) -> (f64, (f64, f64))
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = f64>,
{
    tokio::time::sleep(WARMUP).await;
    let (before, cpu_before) = (measure().await, cpu(replicas));
    let start = Instant::now();
    tokio::time::sleep(window).await;
    let (after, cpu_after) = (measure().await, cpu(replicas));
    let secs = start.elapsed().as_secs_f64();
    (
        (after - before) / secs,
        (
            (cpu_after.0 - cpu_before.0) / secs,
            (cpu_after.1 - cpu_before.1) / secs,
        ),
    )
}

fn client(channel: &tonic::transport::Channel, token: &str) -> troupe_tests::Client {
    SessionServiceClient::with_interceptor(channel.clone(), Bearer::new(Some(token)).unwrap())
}

async fn spawns(n: usize, quota: u64, span: Duration) -> (f64, (f64, f64)) {
    let (replicas, _store, _pool) = fleet(n, quota, None).await;
    let stop = Arc::new(AtomicBool::new(false));
    let children = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for worker in 0..SPAWNERS {
        let channel = replicas[worker % n].process.channel().await;
        let (stop, children) = (stop.clone(), children.clone());
        tasks.push(tokio::spawn(async move {
            let mut op = client(&channel, OPERATOR_TOKEN);
            let mut tree = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let workspace = format!("w{worker}-{}", tree / TREES_PER_WORKSPACE);
                tree += 1;
                let Ok(root) = op
                    .create_root_session(pb::CreateRootSessionRequest {
                        workspace_id: workspace,
                        trust_level: TrustLevel::Direct as i32,
                        title: "root".into(),
                        agent_name: "worker".into(),
                        ..Default::default()
                    })
                    .await
                else {
                    continue;
                };
                let mut as_root = client(&channel, &root.into_inner().session_token);
                for i in 0..BURST {
                    if as_root
                        .create_session(child(&format!("c{i}")))
                        .await
                        .is_ok()
                    {
                        children.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    let counted = window(&replicas, span, || async {
        children.load(Ordering::Relaxed) as f64
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    counted
}

/// One root session of `agent` per workspace, created through the
/// replicas in turn; returns their ids once each runs.
async fn agents(replicas: &[Confined], workspaces: &[String], agent: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for (i, workspace) in workspaces.iter().enumerate() {
        let mut op = client(
            &replicas[i % replicas.len()].process.channel().await,
            OPERATOR_TOKEN,
        );
        let created = op
            .create_root_session(pb::CreateRootSessionRequest {
                workspace_id: workspace.clone(),
                trust_level: TrustLevel::Direct as i32,
                title: agent.into(),
                agent_name: agent.into(),
                initial_message: "go".into(),
                ..Default::default()
            })
            .await
            .expect("an agent")
            .into_inner();
        ids.push(created.session.unwrap().session_id);
    }
    let op = client(&replicas[0].process.channel().await, OPERATOR_TOKEN);
    for id in &ids {
        until("an agent never ran", MINUTE, || {
            let mut op = op.clone();
            async move {
                let s = op
                    .get_session(troupe_tests::get(id))
                    .await
                    .ok()?
                    .into_inner();
                (s.session?.status() == pb::SessionStatus::Running).then_some(())
            }
        })
        .await;
    }
    ids
}

/// Ends the sessions, through the first replica.
async fn end(replicas: &[Confined], ids: &[String]) {
    let mut op = client(&replicas[0].process.channel().await, OPERATOR_TOKEN);
    for id in ids {
        let _ = op.terminate_session(troupe_tests::terminate(id)).await;
    }
}

async fn messages(
    n: usize,
    quota: u64,
    span: Duration,
    runner: &str,
    workspaces: &[String],
) -> (f64, (f64, f64)) {
    let (replicas, _store, pool) = fleet(n, quota, Some(runner)).await;
    let ids = agents(&replicas, workspaces, "sink").await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for sender in 0..SENDERS {
        let channel = replicas[sender % n].process.channel().await;
        let (stop, ids) = (stop.clone(), ids.clone());
        tasks.push(tokio::spawn(async move {
            let mut op = client(&channel, OPERATOR_TOKEN);
            let mut k = sender;
            while !stop.load(Ordering::Relaxed) {
                let to = &ids[k % ids.len()];
                k += 1;
                let _ = op
                    .send_message(troupe_tests::message(to, "a short note"))
                    .await;
            }
        }));
    }
    let delivered = || async {
        let sum: i64 =
            sqlx::query_scalar("SELECT COALESCE(SUM(delivered_seq), 0)::bigint FROM processes")
                .fetch_one(&pool)
                .await
                .unwrap();
        sum as f64
    };
    let counted = window(&replicas, span, delivered).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    end(&replicas, &ids).await;
    counted
}

async fn output(
    n: usize,
    quota: u64,
    span: Duration,
    runner: &str,
    workspaces: &[String],
) -> ((f64, f64), (f64, f64)) {
    let (replicas, _store, pool) = fleet(n, quota, Some(runner)).await;
    let ids = agents(&replicas, workspaces, "printer").await;
    let events = || async {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM events WHERE kind = 'output'")
            .fetch_one(&pool)
            .await
            .unwrap();
        n as f64
    };
    // Lines: each agent's output tail ends with its last line stored.
    let lines = || async {
        let tails: Vec<Vec<u8>> = sqlx::query_scalar(
            "SELECT p.output_tail FROM processes p JOIN sessions s USING (session_id) \
             WHERE s.status = 'running'",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        tails
            .iter()
            .filter_map(|t| {
                let text = String::from_utf8_lossy(t);
                text.lines()
                    .rev()
                    .find_map(|l| l.strip_prefix("line")?.parse::<u64>().ok())
            })
            .sum::<u64>() as f64
    };
    tokio::time::sleep(WARMUP).await;
    let (e0, l0, c0) = (events().await, lines().await, cpu(&replicas));
    let start = Instant::now();
    tokio::time::sleep(span).await;
    let (e1, l1, c1) = (events().await, lines().await, cpu(&replicas));
    let secs = start.elapsed().as_secs_f64();
    end(&replicas, &ids).await;
    (
        ((e1 - e0) / secs, (l1 - l0) / secs),
        ((c1.0 - c0.0) / secs, (c1.1 - c0.1) / secs),
    )
}
