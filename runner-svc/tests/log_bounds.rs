//! The bounds on what exec logs keep: per exec and in total, by policy,
//! measured as the blocks the logs take on disk, and what watchers are told
//! of what was dropped.

use crate::common;

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use common::*;
use troupe_proto::runner::{
    ExecEvent, ExecState, ExitReason, ListExecsRequest, TerminateExecRequest, WriteStdinRequest,
    exec_event,
};

const MINUTE: Duration = Duration::from_secs(60);
const MIB: u64 = 1 << 20;
/// What a log may take on disk beyond its bound while it runs: the output
/// window the tests set, one record past it, and the two blocks at its ends.
const WINDOW_KIB: u64 = 1024;
const BLOCKS: u64 = 2 * 4096;
const SLACK: u64 = WINDOW_KIB * 1024 + 64 * 1024 + 13 + BLOCKS;

/// Bytes the file takes on disk (its blocks, not its size).
fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.blocks() * 512)
}

/// Samples the largest sum of the files' allocated bytes until dropped.
struct Peak {
    max: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Peak {
    fn watch(paths: Vec<PathBuf>) -> Peak {
        let (max, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let thread = {
            let (max, stop) = (max.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let now = paths.iter().map(|p| allocated(p)).sum();
                    max.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };
        Peak {
            max,
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap();
        self.max.load(Ordering::SeqCst)
    }
}

/// Waits, without watching it, until the exec has exited.
async fn wait_exited(client: &mut Client, exec_id: &str) {
    tokio::time::timeout(MINUTE, async {
        loop {
            let execs = client
                .list_execs(ListExecsRequest::default())
                .await
                .unwrap()
                .into_inner()
                .execs;
            if execs
                .iter()
                .any(|e| e.exec_id == exec_id && e.state() == ExecState::Exited)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{exec_id} did not end: was it held back?"));
}

/// Waits until the file's size has reached `size`.
async fn wait_size(path: &Path, size: u64) {
    tokio::time::timeout(MINUTE, async {
        while std::fs::metadata(path).map_or(0, |m| m.len()) < size {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} never reached {size} bytes", path.display()));
}

fn truncation(event: &ExecEvent) -> Option<(u64, u64)> {
    match &event.event {
        Some(exec_event::Event::Truncated(t)) => Some((t.first_kept_sequence, t.dropped_bytes)),
        _ => None,
    }
}

/// Checks a watch from sequence 0 of a log whose head was dropped: the
/// marker first, then the kept records in order, the exit last.
fn check_truncated_watch(out: &Collected) -> (u64, u64) {
    let (first_kept, dropped) = truncation(&out.events[0]).expect("a truncation marker first");
    assert_eq!(out.events[0].sequence, first_kept - 1);
    let sequences: Vec<u64> = out.events[1..].iter().map(|e| e.sequence).collect();
    let expected: Vec<u64> = (first_kept..first_kept + sequences.len() as u64).collect();
    assert_eq!(sequences, expected, "the kept records follow the marker");
    assert!(out.events[1..].iter().all(|e| truncation(e).is_none()));
    (first_kept, dropped)
}

#[tokio::test]
async fn a_log_past_its_bound_drops_its_oldest_output_and_the_agent_runs_on() {
    let runner = TestRunner::start_with(|c| {
        c.exec_log_max_mib = 1;
        c.output_window_kib = WINDOW_KIB;
    })
    .await;
    let ws = runner.workspace("bound");
    let log = runner.exec_dir(&ws, "chatty").join("output.log");
    let peak = Peak::watch(vec![log.clone()]);
    // 50 MiB that nobody watches, then a tail that must arrive whole.
    runner
        .sh(&ws, "chatty", "yes | head -c 52428800; seq 1 20000")
        .await;
    let mut client = runner.client().await;
    wait_exited(&mut client, "chatty").await;
    let peak = peak.finish();
    let now = allocated(&log);
    assert!(
        peak <= MIB + SLACK,
        "the log took {peak} bytes on disk at its peak"
    );
    assert!(now <= MIB + BLOCKS, "the log takes {now} bytes on disk");
    assert!(std::fs::metadata(&log).unwrap().len() > 50 * MIB);

    let out = collect(&mut client, "chatty", 0, MINUTE).await;
    let (first_kept, dropped) = check_truncated_watch(&out);
    assert!(dropped > 49 * MIB, "{dropped} bytes dropped");
    let tail: String = (1..=20000).map(|i| format!("{i}\n")).collect();
    let kept = out.stdout_text();
    let before = kept
        .strip_suffix(&tail)
        .unwrap_or_else(|| panic!("the tail is not intact: ...{:?}", &kept[kept.len() - 100..]));
    assert!(before.bytes().all(|b| b == b'y' || b == b'\n'));
    assert!(out.stdout.len() as u64 <= MIB);
    assert_eq!(out.exit.unwrap().1, ExitReason::Exited);

    // Resuming after a dropped sequence gets the same marker; after the
    // marker's sequence, the kept records alone.
    let again = collect(&mut client, "chatty", 3, MINUTE).await;
    assert_eq!(truncation(&again.events[0]), Some((first_kept, dropped)));
    assert_eq!(again.stdout, out.stdout);
    let resumed = collect(&mut client, "chatty", first_kept - 1, MINUTE).await;
    assert!(resumed.events.iter().all(|e| truncation(e).is_none()));
    assert_eq!(resumed.stdout, out.stdout);
}

#[tokio::test]
async fn a_restarted_runner_reads_a_log_whose_head_was_dropped() {
    let mut runner = TestRunner::start_with(|c| {
        c.exec_log_max_mib = 1;
        c.output_window_kib = WINDOW_KIB;
    })
    .await;
    let ws = runner.workspace("rehead");
    runner
        .sh(
            &ws,
            "chatty",
            "yes | head -c 8388608; echo half; read go; yes | head -c 8388608; echo $go",
        )
        .await;
    let log = runner.exec_dir(&ws, "chatty").join("output.log");
    wait_size(&log, 8 * MIB).await;
    let mut client = runner.client().await;
    let before = tokio::time::timeout(MINUTE, async {
        loop {
            let out = watch_some(&mut client, "chatty").await;
            if out.stdout_text().ends_with("half\n") {
                return out;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the first half must be read");
    let (first_kept, _) = check_truncated_watch(&before);

    runner.restart().await;
    let mut client = runner.client().await;
    let after = watch_some(&mut client, "chatty").await;
    assert_eq!(truncation(&after.events[0]).unwrap().0, first_kept);
    assert_eq!(after.stdout, before.stdout, "what was kept is kept");

    // The restarted runner keeps bounding the log it found.
    let peak = Peak::watch(vec![log.clone()]);
    client
        .write_stdin(WriteStdinRequest {
            exec_id: "chatty".into(),
            data: b"done\n".to_vec(),
            close: true,
            ..Default::default()
        })
        .await
        .unwrap();
    wait_exited(&mut client, "chatty").await;
    let peak = peak.finish();
    assert!(peak <= MIB + SLACK, "{peak} bytes on disk at the peak");
    let out = collect(&mut client, "chatty", 0, MINUTE).await;
    let (later_kept, dropped) = check_truncated_watch(&out);
    assert!(later_kept > first_kept && dropped > 15 * MIB);
    assert!(out.stdout_text().ends_with("y\ndone\n"));
}

/// What a watch from 0 gets until it has caught up with the log (not its end).
async fn watch_some(client: &mut Client, exec_id: &str) -> Collected {
    let info = client
        .list_execs(ListExecsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .execs
        .into_iter()
        .find(|e| e.exec_id == exec_id)
        .expect("listed");
    let mut stream = client
        .watch_exec(troupe_proto::runner::WatchExecRequest {
            exec_id: exec_id.into(),
            after_sequence: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Collected::default();
    while out
        .events
        .last()
        .is_none_or(|e| e.sequence < info.last_sequence)
    {
        let event = tokio::time::timeout(MINUTE, tokio_stream::StreamExt::next(&mut stream))
            .await
            .expect("events")
            .expect("open")
            .expect("event");
        out.add(event);
    }
    out
}

#[tokio::test]
async fn all_logs_together_keep_within_the_total_exited_ones_first() {
    let runner = TestRunner::start_with(|c| {
        c.logs_max_mib = 2;
        c.output_window_kib = WINDOW_KIB;
    })
    .await;
    let ws = runner.workspace("total");
    let logs: Vec<PathBuf> = ["old", "live"]
        .iter()
        .map(|id| runner.exec_dir(&ws, id).join("output.log"))
        .collect();
    let peak = Peak::watch(logs.clone());
    let mut client = runner.client().await;
    // Each alone is within its own bound (64 MiB), not both together. A
    // watcher follows each, as the session service does.
    runner.sh(&ws, "old", "yes | head -c 3145728").await;
    let old = collect(&mut client, "old", 0, MINUTE).await;
    assert_eq!(old.stdout.len() as u64, 3 * MIB, "the watcher read it all");
    runner
        .sh(&ws, "live", "yes | head -c 3145728; echo live-tail; read x")
        .await;
    wait_for_output(&mut client, "live", "live-tail\n").await;
    let live = watch_some(&mut client, "live").await;
    let peak = peak.finish();
    assert!(
        peak <= 2 * MIB + 2 * SLACK,
        "{peak} bytes on disk at the peak"
    );
    let now: u64 = logs.iter().map(|p| allocated(p)).sum();
    assert!(now <= 2 * MIB + 2 * BLOCKS, "{now} bytes on disk");

    // The exited exec's output went first, all of it; the live one keeps
    // the rest of the total.
    let old = collect(&mut client, "old", 0, MINUTE).await;
    check_truncated_watch(&old);
    assert!(old.stdout.is_empty(), "{} bytes kept", old.stdout.len());
    assert_eq!(old.exit.unwrap().1, ExitReason::Exited);
    check_truncated_watch(&live);
    assert!(live.stdout.len() as u64 >= MIB, "{}", live.stdout.len());

    client
        .terminate_exec(TerminateExecRequest {
            exec_id: "live".into(),
            grace_ms: 100,
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn the_pause_policy_holds_the_agent_and_loses_nothing() {
    let runner = TestRunner::start_with(|c| {
        c.exec_log_max_mib = 1;
        c.exec_log_policy = troupe_runner_svc::config::LogPolicy::Pause;
    })
    .await;
    let ws = runner.workspace("pause");
    let log = runner.exec_dir(&ws, "chatty").join("output.log");
    let peak = Peak::watch(vec![log.clone()]);
    let script =
        "head -c 8388608 /dev/urandom > $TMPDIR/out; sha256sum $TMPDIR/out >&2; cat $TMPDIR/out";
    runner.sh(&ws, "chatty", script).await;
    // Nobody watches: the agent is held once the log is at its bound
    // (the default window, 16 MiB, is lowered to it).
    let mut size = 0;
    for _ in 0..300 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = std::fs::metadata(&log).unwrap().len();
        if now == size && now >= MIB {
            break;
        }
        size = now;
    }
    assert!(
        size <= MIB + 64 * 1024 + 13,
        "the log ran {size} bytes ahead"
    );
    let mut client = runner.client().await;
    let info = |execs: Vec<troupe_proto::runner::ExecInfo>| {
        execs.into_iter().find(|e| e.exec_id == "chatty").unwrap()
    };
    let listed = info(
        client
            .list_execs(ListExecsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .execs,
    );
    assert_eq!(listed.state(), ExecState::Running);

    let out = collect(&mut client, "chatty", 0, MINUTE).await;
    let peak = peak.finish();
    assert!(out.events.iter().all(|e| truncation(e).is_none()));
    assert_eq!(out.stdout.len(), 8 << 20);
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&out.stdout));
    assert_eq!(
        out.stderr_text().split_whitespace().next(),
        Some(digest.as_str())
    );
    // Under pause a cut also waits for the watcher: up to a window more.
    let window = MIB;
    assert!(
        peak <= MIB + 2 * window + 64 * 1024 + 13 + BLOCKS,
        "{peak} bytes on disk at the peak"
    );
    assert!(std::fs::metadata(&log).unwrap().len() > 8 * MIB);
}
