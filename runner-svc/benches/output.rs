//! Output at a watcher's pace: one agent prints as fast as it can, and an
//! operator watching its session counts the output bytes that reach it
//! (those in output events, and those an `output_truncated` marker says
//! were dropped), from the first output event to the session's end, on the
//! backend `TROUPE_TEST_BACKEND` names. A marker counts every byte the
//! session dropped, those the watcher had read before they went included,
//! so a watcher that fell behind counts some bytes twice: the check is that
//! none is missing.
//!
//! `TROUPE_BENCH_OUTPUT_BYTES` sets how much the agent prints (default
//! 512 MiB). `cargo bench -p troupe-runner-svc --bench output` (needs
//! DOCKER_HOST and the image, as the tests do).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::pair::Pair;
use futures::StreamExt;
use troupe_proto::session::session_event::Detail;

const MIB: f64 = (1 << 20) as f64;

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench());
}

async fn bench() {
    let bytes: u64 = std::env::var("TROUPE_BENCH_OUTPUT_BYTES")
        .ok()
        .map(|v| {
            v.parse()
                .expect("TROUPE_BENCH_OUTPUT_BYTES: a number of bytes")
        })
        .unwrap_or(512 << 20);
    let backend = troupe_tests::postgres::Backend::from_env();
    let pair = Pair::start().await;
    let ws = pair.runner.workspace("output");
    pair.agent(
        &ws,
        "flood",
        &format!("yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c {bytes}"),
    );
    let created = Instant::now();
    let root = pair.root(&ws, "flood", "go").await;
    let mut events = pair.watch(&root.session_id).await;
    let (mut shown, mut dropped, mut chunks) = (0u64, 0u64, 0u64);
    let mut first = None;
    let deadline = created + Duration::from_secs(3600);
    let exit = loop {
        let event = tokio::time::timeout_at(deadline.into(), events.next())
            .await
            .expect("the agent did not finish within an hour")
            .expect("the watch ended before the session")
            .expect("watch");
        match event.detail {
            Some(Detail::Output(out)) => {
                first.get_or_insert_with(Instant::now);
                shown += out.data.len() as u64;
                chunks += 1;
            }
            Some(Detail::OutputTruncated(t)) if !t.by_runner => dropped = t.dropped_bytes,
            Some(Detail::Ended(ended)) => break ended,
            _ => {}
        }
    };
    let at_watcher = first.expect("no output reached the watcher").elapsed();
    let total = created.elapsed();
    let mb = |n: u64, d: Duration| n as f64 / 1e6 / d.as_secs_f64();
    println!(
        "{backend:?}: {:.0} MiB printed, exit {} ({}); at the watcher {:.1} MiB in {chunks} \
         output events and {:.1} MiB marked dropped",
        bytes as f64 / MIB,
        exit.exit_code,
        exit.reason,
        shown as f64 / MIB,
        dropped as f64 / MIB,
    );
    println!(
        "{backend:?}: first output event to the end {:.2} s: {:.1} MB/s; create to the end \
         {:.2} s: {:.1} MB/s",
        at_watcher.as_secs_f64(),
        mb(shown + dropped, at_watcher),
        total.as_secs_f64(),
        mb(bytes, total),
    );
    assert!(shown <= bytes, "{shown} bytes shown of {bytes} printed");
    assert!(
        shown + dropped >= bytes,
        "every byte shown or marked dropped: {shown} + {dropped} of {bytes}"
    );
}
