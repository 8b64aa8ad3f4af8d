//! What span export costs on the spawn path: CreateSession p50/p99 against
//! two `troupe-session` processes in one run, one exporting its spans to a
//! real OTLP receiver on loopback and one exporting nothing, called in
//! alternating rounds so both see the same machine. Prints a Markdown table
//! (the figures in BENCHMARKS.md).
//!
//! Run: `cargo bench -p troupe-session-svc --bench export`

use std::time::{Duration, Instant};

use troupe_proto::session::CreateSessionRequest;
use troupe_tests::{
    Client,
    bench::{ms, percentile},
    otlp::Receiver,
    process::SessionProcess,
};

const ROUNDS: usize = 40;
const PER_ROUND: usize = 100;
/// Children per root: each call's parent is an agent session with room.
const CHILDREN_PER_ROOT: usize = 8;

const UNLIMITED: [&str; 8] = [
    "--max-tree-sessions",
    "1000000",
    "--max-children",
    "1000000",
    "--max-active-per-workspace",
    "1000000",
    "--spawn-rate-per-sec",
    "0",
];

/// Agent clients of roots that spawn the calls' children.
async fn spawners(service: &SessionProcess, count: usize) -> Vec<Client> {
    let mut out = Vec::new();
    for _ in 0..count {
        let token = service.create_root_in(None).await.session_token;
        out.push(service.client(&token).await);
    }
    out
}

/// One round of `PER_ROUND` spawns from `spawners`, starting at call `from`.
async fn round(spawners: &[Client], from: usize, times: &mut Vec<Duration>) {
    for i in from..from + PER_ROUND {
        let mut client = spawners[i / CHILDREN_PER_ROOT].clone();
        let start = Instant::now();
        client
            .create_session(CreateSessionRequest {
                agent_name: "worker".into(),
                title: format!("child {i}"),
                ..Default::default()
            })
            .await
            .expect("create");
        times.push(start.elapsed());
    }
}

/// A receiver on a thread and runtime of its own, as a collector would be
/// a process of its own: decoding exports never holds up the calls.
fn receiver_apart() -> (Receiver, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            tx.send(Receiver::serve(listener)).unwrap();
            std::future::pending::<()>().await
        });
    });
    (rx.recv().unwrap(), endpoint)
}

#[tokio::main]
async fn main() {
    let binary = env!("CARGO_BIN_EXE_troupe-session");
    let (receiver, endpoint) = receiver_apart();
    let quiet = SessionProcess::start(binary, &UNLIMITED, &[]);
    let traced = SessionProcess::start(
        binary,
        &UNLIMITED,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())],
    );
    let roots = (ROUNDS + 1) * PER_ROUND / CHILDREN_PER_ROOT + 1;
    let quiet_spawners = spawners(&quiet, roots).await;
    let traced_spawners = spawners(&traced, roots).await;

    let (mut off, mut on) = (Vec::new(), Vec::new());
    // A warm-up round each, not counted.
    round(&quiet_spawners, 0, &mut Vec::new()).await;
    round(&traced_spawners, 0, &mut Vec::new()).await;
    for r in 1..=ROUNDS {
        round(&quiet_spawners, r * PER_ROUND, &mut off).await;
        round(&traced_spawners, r * PER_ROUND, &mut on).await;
    }
    assert!(traced.stop().await && quiet.stop().await);
    let spawns = receiver
        .spans()
        .iter()
        .filter(|s| s.name == "spawn")
        .count();
    assert!(
        spawns >= ROUNDS * PER_ROUND,
        "the traced service exported {spawns} spawn spans"
    );

    off.sort();
    on.sort();
    let p99 = |t: &[Duration]| percentile(t, 99.0);
    let p50 = |t: &[Duration]| percentile(t, 50.0);
    println!(
        "| CreateSession, {} calls each | p50 ms | p99 ms |",
        off.len()
    );
    println!("|---|---|---|");
    println!("| export off | {} | {} |", ms(p50(&off)), ms(p99(&off)));
    println!("| export on | {} | {} |", ms(p50(&on)), ms(p99(&on)));
    println!(
        "| on / off | {:.2} | {:.2} |",
        p50(&on).as_secs_f64() / p50(&off).as_secs_f64(),
        p99(&on).as_secs_f64() / p99(&off).as_secs_f64()
    );
}
