//! The model gateway's cost, against the scripted upstream on loopback, in
//! one run: time to first token of a streamed call through the gateway and
//! to the same upstream directly (interleaved, so both meet the same
//! moments of the machine), for each API the gateway speaks (Anthropic
//! Messages, OpenAI Chat Completions and Responses, Gemini), streaming
//! throughput through it (Anthropic's) against
//! directly, and calls per second (each a reservation, a forward and a
//! settlement) with a whole tree calling at once under a budget.
//!
//! Run: `cargo bench -p troupe-tests --bench gateway` (with
//! `TROUPE_TEST_BACKEND=postgres` after `source scripts/pg-env`, the
//! store is PostgreSQL). Names after `--` run only those parts:
//! `first-token`, `streaming`, `calls` (`-- streaming` to profile the relay).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use troupe_tests::{
    TestServer,
    bench::{
        api::{self, Answer, Api, Http, UPSTREAM_KEY, call},
        percentile,
    },
    upstream::{Fault, Turn, Upstream},
};

/// The allocator the `troupe-session` binary runs on.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const TTFT_CALLS: usize = 2_000;
const BIG_BYTES: usize = 64 << 20;
const BIG_RUNS: usize = 5;
/// A delta's text in the answer of many deltas: some words, as a model
/// streams them (each event is then about 130 bytes).
const DELTA_BYTES: usize = 24;
/// The text of the answer of many deltas (some 350,000 events).
const DELTAS_TEXT_BYTES: usize = 8 << 20;
/// The upstream's paces, bytes per second, for an answer of many deltas
/// with this much text (each is far above a model's own pace: a few KB/s).
const PACES: [u64; 2] = [10_000_000, 100_000_000];
const PACED_TEXT_BYTES: usize = 2 << 20;
const TREE: usize = 10;
const CALLERS: usize = 32;
const LOAD: Duration = Duration::from_secs(10);

/// The parts of the bench, as named on its command line.
const PARTS: [&str; 3] = ["first-token", "streaming", "calls"];

/// The parts to run: those named after `--` (cargo's own `--bench` aside),
/// else all.
fn parts() -> Vec<String> {
    let named: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    for name in &named {
        assert!(
            PARTS.contains(&name.as_str()),
            "unknown part {name:?}: the parts are {PARTS:?}"
        );
    }
    if named.is_empty() {
        PARTS.iter().map(|p| (*p).to_owned()).collect()
    } else {
        named
    }
}

#[tokio::main]
async fn main() {
    let parts = parts();
    let runs = |part: &str| parts.iter().any(|p| p == part);
    let _ = nix::sys::prctl::set_thp_disable(true);
    let upstream = Upstream::tcp(vec![]).await;
    let (server, root, _dir) = api::gateway_server(&upstream).await;
    let token = root.session_token.clone();
    let http = api::client();
    let direct = format!("{}/v1/messages", upstream.base_url());
    let gateway = format!("http://{}/v1/messages", server.addr);

    let root_id = root.session.expect("the root").session_id;
    if runs("first-token") {
        println!("| time to first token, ms | direct p50 / p99 | gateway p50 / p99 | difference |");
        println!("|---|---|---|---|");
        for api in Api::ALL {
            let direct = format!("{}{}", upstream.base_url(), api.path());
            let gateway = format!("http://{}{}", server.addr, api.path());
            first_token(&http, &upstream, api, &direct, &gateway, &token).await;
        }
    }
    if runs("streaming") {
        streaming(&http, &upstream, &direct, &gateway, &token).await;
    }
    if runs("calls") {
        calls(&server, &http, &upstream, &gateway, &token, &root_id).await;
    }
}

/// Time to first token of `api`, interleaved.
async fn first_token(
    http: &Http,
    upstream: &Upstream,
    api: Api,
    direct: &str,
    gateway: &str,
    token: &str,
) {
    for _ in 0..(TTFT_CALLS + TTFT_CALLS / 10) * 2 {
        upstream.push(Turn::text("first token"));
    }
    let (mut d, mut g) = (Vec::new(), Vec::new());
    for i in 0..TTFT_CALLS + TTFT_CALLS / 10 {
        let td = call(http, api, direct, UPSTREAM_KEY, true).await.first;
        let tg = call(http, api, gateway, token, true).await.first;
        if i >= TTFT_CALLS / 10 {
            d.push(td);
            g.push(tg);
        }
    }
    d.sort();
    g.sort();
    let ms = |t: Duration| t.as_secs_f64() * 1e3;
    let (d50, d99) = (ms(percentile(&d, 50.0)), ms(percentile(&d, 99.0)));
    let (g50, g99) = (ms(percentile(&g, 50.0)), ms(percentile(&g, 99.0)));
    println!(
        "| {} | {d50:.2} / {d99:.2} | {g50:.2} / {g99:.2} | +{:.2} / +{:.2} |",
        api.name(),
        g50 - d50,
        g99 - d99
    );
}

/// Streaming throughput, direct and through the gateway, alternating, best
/// of BIG_RUNS each way, in MiB/s of the stream's bytes (events and all):
///
/// - the relay's capacity, the upstream sending as fast as it can, timed
///   from an answer's first bytes to its last (the upstream renders a whole
///   answer before its first byte: that is not the relay's): one 64 MiB
///   delta, and 8 MiB of text in deltas of a model's size;
/// - at a provider's pace, the upstream streaming a smaller answer at a set
///   rate, timed from sending the call to the answer's last byte: what an
///   agent waits for the whole answer.
async fn streaming(http: &Http, upstream: &Upstream, direct: &str, gateway: &str, token: &str) {
    let big = "x".repeat(BIG_BYTES);
    let deltas = |text_bytes: usize| Turn::deltas(&big[..DELTA_BYTES], text_bytes / DELTA_BYTES);
    let mut shapes = vec![
        ("one 64 MiB delta".to_owned(), Turn::text(&big), false),
        (
            "8 MiB of text in 24-byte deltas".to_owned(),
            deltas(DELTAS_TEXT_BYTES),
            false,
        ),
    ];
    for rate in PACES {
        let name = format!(
            "2 MiB of text in 24-byte deltas, the upstream streaming at {} MB/s",
            rate / 1_000_000
        );
        let turn = Turn {
            fault: Some(Fault::Pace(rate)),
            ..deltas(PACED_TEXT_BYTES)
        };
        shapes.push((name, turn, true));
    }
    let mib = |b: f64| b / (1 << 20) as f64;
    println!();
    println!("| streaming | timed | direct, MiB/s | through the gateway, MiB/s | ratio |");
    println!("|---|---|---|---|---|");
    for (name, turn, paced) in shapes {
        let rate = |a: Answer| {
            let time = if paced { a.first + a.rest } else { a.rest };
            a.bytes as f64 / time.as_secs_f64()
        };
        let (mut best_d, mut best_g) = (0f64, 0f64);
        for _ in 0..BIG_RUNS {
            upstream.push(turn.clone());
            best_d = best_d.max(rate(
                call(http, Api::Messages, direct, UPSTREAM_KEY, true).await,
            ));
            upstream.push(turn.clone());
            best_g = best_g.max(rate(call(http, Api::Messages, gateway, token, true).await));
        }
        let timed = if paced {
            "call to last byte"
        } else {
            "first byte to last"
        };
        println!(
            "| {name} | {timed} | {:.0} | {:.0} | {:.2}x |",
            mib(best_d),
            mib(best_g),
            best_g / best_d
        );
    }
}

/// Calls per second with a whole tree calling at once.
async fn calls(
    server: &TestServer,
    http: &Http,
    upstream: &Upstream,
    gateway: &str,
    token: &str,
    root_id: &str,
) {
    let mut agent = server.client(Some(token)).await;
    let mut tokens = vec![token.to_owned()];
    for i in 1..TREE {
        let child =
            troupe_tests::create_child(&mut agent, troupe_tests::child(&format!("c{i}"))).await;
        tokens.push(server.token_for(&child.session_id).await);
    }
    for _ in 0..2_000_000 {
        upstream.push(Turn::text("x"));
    }
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let workers: Vec<_> = (0..CALLERS)
        .map(|i| {
            let (http, url, key) = (http.clone(), gateway.to_owned(), tokens[i % TREE].clone());
            let (done, stop) = (done.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    call(&http, Api::Messages, &url, &key, false).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(LOAD).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let calls = done.load(Ordering::Relaxed);
    let rate = calls as f64 / started.elapsed().as_secs_f64();
    let usage = server.get(root_id).await.session.unwrap().usage.unwrap();
    println!();
    println!(
        "| a tree of {TREE} sessions, {CALLERS} callers | calls/s (reserve, forward, settle) | settled |"
    );
    println!("|---|---|---|");
    println!(
        "| {:?} | {rate:.0} | {} |",
        troupe_tests::postgres::Backend::from_env(),
        usage.subtree_calls
    );
}
