//! Runner benchmarks, each against a bare `docker exec` on the same engine,
//! in the same container, in one run:
//!
//! - start: from the call that starts an exec to its first output byte;
//! - throughput: bytes per second from the container to the reader, for a
//!   file of `BENCH_MB` MiB (default 200) printed by `cat`.
//!
//! `cargo bench -p troupe-runner-svc --bench exec` (needs DOCKER_HOST and the
//! image, as the tests do). `BENCH_ONLY=start` or `throughput` runs one part.

#[path = "../tests/common/mod.rs"]
mod common;
mod measure;

use std::time::Instant;

use common::*;
use futures::StreamExt;
use measure::*;
use troupe_proto::runner::{WatchExecRequest, exec_event};

const START_RUNS: usize = 40;
const THROUGHPUT_RUNS: usize = 3;

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench());
}

async fn bench() {
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let runner = TestRunner::start().await;
    let ws = runner.workspace("bench");
    // Creates the container, and the file the throughput part reads.
    let mb: u64 = std::env::var("BENCH_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let prep = run_sh(
        &runner,
        &ws,
        "prep",
        &format!(
            "head -c {} /dev/urandom > /workspace/blob; chmod 644 /workspace/blob",
            mb << 20
        ),
    )
    .await;
    assert_eq!(prep.exit.unwrap().0, 0);
    let docker = bollard::Docker::connect_with_defaults()
        .unwrap()
        .negotiate_version()
        .await
        .unwrap();
    let container = troupe_runner_svc::docker::Engine::container_name(&ws);
    let uid = format!("{}:{}", runner.config.uid_base, runner.config.uid_base);

    if only.is_empty() || only == "start" {
        let mut bare = Vec::new();
        let mut troupe = Vec::new();
        for i in 0..START_RUNS {
            // Interleaved, so both see the same machine.
            bare.push(bare_first_byte(&docker, &container, &uid, &["echo", "x"]).await);
            troupe.push(troupe_first_byte(&runner, &ws, i).await);
        }
        let (b50, b99) = percentiles(&mut bare);
        let (t50, t99) = percentiles(&mut troupe);
        println!("start to first byte over {START_RUNS} runs (ms, p50 / p99):");
        println!("  bare docker exec: {b50:.1} / {b99:.1}");
        println!("  troupe:           {t50:.1} / {t99:.1}");
        println!("  ratio (p50):      {:.2}", t50 / b50);
    }

    if only.is_empty() || only == "throughput" {
        let mut bare = Vec::new();
        let mut cli = Vec::new();
        let mut troupe = Vec::new();
        for i in 0..THROUGHPUT_RUNS {
            bare.push(bare_throughput(&docker, &container, &uid, mb << 20).await);
            cli.push(cli_throughput(&container, &uid, mb << 20));
            troupe.push(troupe_throughput(&runner, &ws, i, mb << 20).await);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (b, c, t) = (median(&mut bare), median(&mut cli), median(&mut troupe));
        println!("throughput of {mb} MiB, median of {THROUGHPUT_RUNS} (MB/s):");
        println!("  docker exec cat (API): {b:.0}   (runs: {bare:.0?})");
        println!("  docker exec cat (CLI): {c:.0}   (runs: {cli:.0?})");
        println!("  troupe watcher:        {t:.0}   (runs: {troupe:.0?})");
        println!("  ratio to the faster:   {:.2}", t / b.max(c));
    }
}

async fn troupe_first_byte(runner: &TestRunner, ws: &str, i: usize) -> f64 {
    let mut client = runner.client().await;
    let id = format!("first-{i}");
    let t = Instant::now();
    client
        .start_exec(start_request(ws, &id, &["echo", "x"]))
        .await
        .unwrap();
    let mut stream = client
        .watch_exec(WatchExecRequest {
            exec_id: id,
            after_sequence: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut elapsed = None;
    while let Some(event) = stream.next().await {
        if let Some(exec_event::Event::Output(_)) = event.unwrap().event
            && elapsed.is_none()
        {
            elapsed = Some(t.elapsed());
        }
    }
    millis(elapsed.expect("no output"))
}

async fn bare_throughput(docker: &bollard::Docker, container: &str, uid: &str, size: u64) -> f64 {
    let t = Instant::now();
    let mut output = bare_exec(docker, container, uid, &["cat", "/workspace/blob"]).await;
    let mut bytes = 0u64;
    while let Some(chunk) = output.next().await {
        bytes += chunk.unwrap().into_bytes().len() as u64;
    }
    assert_eq!(bytes, size);
    size as f64 / t.elapsed().as_secs_f64() / 1e6
}

/// The `docker` command line, reading its stdout through a pipe.
fn cli_throughput(container: &str, uid: &str, size: u64) -> f64 {
    use std::io::Read;
    let t = Instant::now();
    let mut child = std::process::Command::new("docker")
        .args(["exec", "-u", uid, container, "cat", "/workspace/blob"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("docker CLI");
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        match stdout.read(&mut buf).unwrap() {
            0 => break,
            n => bytes += n as u64,
        }
    }
    assert!(child.wait().unwrap().success());
    assert_eq!(bytes, size);
    size as f64 / t.elapsed().as_secs_f64() / 1e6
}

async fn troupe_throughput(runner: &TestRunner, ws: &str, i: usize, size: u64) -> f64 {
    let mut client = runner.client().await;
    let id = format!("cat-{i}");
    let t = Instant::now();
    client
        .start_exec(start_request(ws, &id, &["cat", "/workspace/blob"]))
        .await
        .unwrap();
    let mut stream = client
        .watch_exec(WatchExecRequest {
            exec_id: id,
            after_sequence: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut bytes = 0u64;
    while let Some(event) = stream.next().await {
        if let Some(exec_event::Event::Output(out)) = event.unwrap().event {
            bytes += out.data.len() as u64;
        }
    }
    assert_eq!(bytes, size);
    size as f64 / t.elapsed().as_secs_f64() / 1e6
}
