//! What span export costs on the spawn path: CreateSession p50/p99 against
//! four `troupe-session` processes in one run: two exporting nothing (the
//! baseline is their calls pooled; each alone says how far two identical
//! processes differ, the comparison's noise), one exporting its spans to a
//! real OTLP receiver on loopback, and one exporting to a receiver that is
//! down; each call is made to the four in turn, each round starting at the
//! next one, so all see the same moments of the machine and none always
//! comes first. The calls alternate two titles, for two sizes of response
//! (see `TITLES`). Prints Markdown tables (the figures in BENCHMARKS.md):
//! the percentiles by title and for both, and each process's CPU per call.
//!
//! Run: `cargo bench -p troupe-session-svc --bench export` (`BENCH_CALLS`:
//! counted calls per process, default 4,000; `OTEL_BSP_*` variables are
//! passed to the exporting processes)

use std::time::{Duration, Instant};

use troupe_proto::session::{CreateSessionRequest, session_service_client::SessionServiceClient};
use troupe_tests::{
    Client,
    bench::{ms, percentile},
    otlp::Receiver,
    process::SessionProcess,
};

/// Counted calls per process (unless `BENCH_CALLS` says), after `WARM_UP`
/// uncounted ones.
const CALLS: usize = 4000;
const WARM_UP: usize = 100;
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

/// Agent clients of roots that spawn the calls' children, each with its
/// root's token, all on one connection (a connection each would run the
/// service out of file descriptors at large `BENCH_CALLS`).
async fn spawners(service: &SessionProcess, count: usize) -> Vec<Client> {
    let channel = service.channel().await;
    let mut out = Vec::new();
    for _ in 0..count {
        let token = service.create_root_in(None).await.session_token;
        let auth = troupe_proto::endpoint::Bearer::new(Some(&token)).unwrap();
        out.push(SessionServiceClient::with_interceptor(
            channel.clone(),
            auth,
        ));
    }
    out
}

/// The environment of a process exporting to `endpoint`, with the batch
/// processor's settings `batching`.
fn exporting<'a>(endpoint: &'a str, batching: &'a [(String, String)]) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)];
    env.extend(batching.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    env
}

/// The requests' titles, taken in turn, for two sizes of response. gRPC
/// over h2 answers in one write while the response message is at most 251
/// bytes, and in two above that: h2 copies a DATA frame of up to 256 bytes
/// (the message and its 5-byte prefix) into its write buffer, sends a
/// larger one from the message's own, and the trailers wait for a write of
/// their own. A session's trace id adds 34 bytes. With the short title a
/// response is 223 to 226 bytes exporting nothing and 257 to 260
/// exporting, so only the traced one takes two writes; with the
/// descriptive title both do.
const TITLES: [(&str, &str); 2] = [
    ("short", "child"),
    (
        "descriptive",
        "child, to review the storage layer's error paths:",
    ),
];

/// Spawns child `i` from `spawners`, with title `TITLES[i % 2]`, and
/// returns how long the call took.
async fn spawn(spawners: &[Client], i: usize) -> Duration {
    let mut client = spawners[i / CHILDREN_PER_ROOT].clone();
    let start = Instant::now();
    client
        .create_session(CreateSessionRequest {
            agent_name: "worker".into(),
            title: format!("{} {i}", TITLES[i % TITLES.len()].1),
            ..Default::default()
        })
        .await
        .expect("create");
    start.elapsed()
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
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let calls = std::env::var("BENCH_CALLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CALLS);
    // The batch processor's settings (`OTEL_BSP_*`) of this environment go
    // to the exporting processes, for experiments; nothing else of it does.
    let batching: Vec<(String, String)> = std::env::vars()
        .filter(|(name, _)| name.starts_with("OTEL_BSP_"))
        .collect();
    let setups: [(&str, Vec<(&str, &str)>); 4] = [
        ("export off", vec![]),
        ("export off, a second process", vec![]),
        ("export on", exporting(&endpoint, &batching)),
        ("export on, receiver down", exporting(&dead, &batching)),
    ];
    let roots = (WARM_UP + calls).div_ceil(CHILDREN_PER_ROOT);
    let mut services = Vec::new();
    for (label, env) in &setups {
        let service = SessionProcess::start(binary, &UNLIMITED, env);
        let clients = spawners(&service, roots).await;
        services.push((*label, service, clients, Vec::new()));
    }

    // Uncounted warm-up calls, then the counted ones; each call goes to
    // every process in turn, each round starting at the next process, so
    // that no process is always the one called first (or last) in a round.
    let count = services.len();
    for i in 0..WARM_UP {
        for (_, _, clients, _) in &services {
            spawn(clients, i).await;
        }
    }
    let cpu_before: Vec<Duration> = services.iter().map(|s| s.1.cpu_time()).collect();
    for i in WARM_UP..WARM_UP + calls {
        for turn in 0..count {
            let (_, _, clients, times) = &mut services[(i + turn) % count];
            times.push((i % TITLES.len(), spawn(clients, i).await));
        }
    }
    // Per process: its label, its calls' (title, time), its CPU per call.
    let mut measured = Vec::new();
    for ((label, service, _, times), before) in services.into_iter().zip(cpu_before) {
        // The service's CPU time per call: steadier than latency on a busy machine.
        let cpu = (service.cpu_time() - before) / times.len() as u32;
        assert!(service.stop().await, "{label}: clean stop");
        measured.push((label, times, cpu));
    }
    // The baseline: the processes exporting nothing, their calls pooled.
    let baseline: Vec<_> = measured
        .iter()
        .filter(|(label, ..)| label.starts_with("export off"))
        .collect();
    let off_cpu = baseline.iter().map(|(.., cpu)| *cpu).sum::<Duration>() / baseline.len() as u32;
    let pooled: Vec<(usize, Duration)> = baseline
        .iter()
        .flat_map(|(_, calls, _)| calls.iter().copied())
        .collect();
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    // The sorted times of `calls` with title `title` (any title if `None`).
    let of_title = |calls: &[(usize, Duration)], title: Option<usize>| {
        let mut times: Vec<Duration> = calls
            .iter()
            .filter(|(t, _)| title.is_none_or(|title| title == *t))
            .map(|(_, took)| *took)
            .collect();
        times.sort();
        times
    };

    println!("| CreateSession | title | calls | p50 ms | p99 ms | p50 / off | p99 / off |");
    println!("|---|---|---|---|---|---|---|");
    let groups = (0..TITLES.len())
        .map(|t| (Some(t), TITLES[t].0))
        .chain([(None, "both")]);
    for (title, name) in groups {
        let off = of_title(&pooled, title);
        let (off50, off99) = (percentile(&off, 50.0), percentile(&off, 99.0));
        let rows = std::iter::once(("export off, both processes pooled", off)).chain(
            measured
                .iter()
                .map(|(label, calls, _)| (*label, of_title(calls, title))),
        );
        for (label, times) in rows {
            let (p50, p99) = (percentile(&times, 50.0), percentile(&times, 99.0));
            println!(
                "| {label} | {name} | {} | {} | {} | {:.2} | {:.2} |",
                times.len(),
                ms(p50),
                ms(p99),
                ratio(p50, off50),
                ratio(p99, off99),
            );
        }
    }
    println!();
    println!("| process | service CPU per call, µs | CPU / off (both pooled) |");
    println!("|---|---|---|");
    for (label, _, cpu) in &measured {
        println!(
            "| {label} | {} | {:.2} |",
            cpu.as_micros(),
            ratio(*cpu, off_cpu)
        );
    }
    // After the table, so that an experiment whose export failed still shows it.
    let spawns = receiver
        .spans()
        .iter()
        .filter(|s| s.name == "spawn")
        .count();
    assert!(
        spawns >= calls,
        "the traced service exported {spawns} spawn spans"
    );
}
