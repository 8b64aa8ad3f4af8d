//! Sequenced stdin against a real Docker engine: each frame sequence reaches
//! an exec's stdin once, whether repeated by a later write, by concurrent
//! writers, or after the runner restarted; malformed frames are refused.

use crate::common;

use std::time::Duration;

use common::*;
use tokio_stream::StreamExt;
use tonic::Code;
use troupe_proto::runner::{ListExecsRequest, StdinFrame, WatchExecRequest, WriteStdinRequest};

const MINUTE: Duration = Duration::from_secs(60);

/// Frames `from..=to`, frame `n` being the line `n`.
fn frames(from: u64, to: u64) -> Vec<StdinFrame> {
    (from..=to)
        .map(|n| StdinFrame {
            sequence: n,
            data: format!("{n}\n").into_bytes(),
        })
        .collect()
}

fn lines(from: u64, to: u64) -> String {
    (from..=to).map(|n| format!("{n}\n")).collect()
}

async fn write(client: &mut Client, exec_id: &str, frames: Vec<StdinFrame>) -> u64 {
    client
        .write_stdin(WriteStdinRequest {
            exec_id: exec_id.into(),
            frames,
            ..Default::default()
        })
        .await
        .expect("write")
        .into_inner()
        .stdin_sequence
}

async fn close(client: &mut Client, exec_id: &str) {
    client
        .write_stdin(WriteStdinRequest {
            exec_id: exec_id.into(),
            close: true,
            ..Default::default()
        })
        .await
        .expect("close");
}

async fn stdin_sequence(client: &mut Client, exec_id: &str) -> u64 {
    client
        .list_execs(ListExecsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .execs
        .into_iter()
        .find(|e| e.exec_id == exec_id)
        .expect("listed")
        .stdin_sequence
}

#[tokio::test]
async fn frames_given_at_start_or_by_an_earlier_write_are_not_written_again() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("frames");
    let mut client = runner.client().await;
    let mut req = start_request(&ws, "cat-f", &["cat"]);
    req.initial_frames = frames(1, 2);
    client.start_exec(req).await.expect("start");
    assert_eq!(write(&mut client, "cat-f", frames(1, 3)).await, 3);
    assert_eq!(write(&mut client, "cat-f", frames(2, 4)).await, 4);
    assert_eq!(write(&mut client, "cat-f", frames(3, 3)).await, 4);
    assert_eq!(stdin_sequence(&mut client, "cat-f").await, 4);
    close(&mut client, "cat-f").await;
    let out = collect(&mut client, "cat-f", 0, MINUTE).await;
    assert_eq!(out.stdout_text(), lines(1, 4));
}

#[tokio::test]
async fn concurrent_writers_of_overlapping_frames_write_each_once_in_order() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("frames-race");
    let mut client = runner.client().await;
    client
        .start_exec(start_request(&ws, "cat-r", &["cat"]))
        .await
        .expect("start");
    // Each writer sends everything from 1, as owners that read the same
    // undelivered messages at different times do.
    let ends = [7u64, 20, 3, 15, 20, 11, 1, 18];
    let writers: Vec<_> = ends
        .iter()
        .map(|&end| {
            let mut client = client.clone();
            tokio::spawn(async move { write(&mut client, "cat-r", frames(1, end)).await })
        })
        .collect();
    for (writer, end) in writers.into_iter().zip(ends) {
        let received = writer.await.unwrap();
        assert!(received >= end, "answered {received} after frames to {end}");
    }
    close(&mut client, "cat-r").await;
    let out = collect(&mut client, "cat-r", 0, MINUTE).await;
    assert_eq!(out.stdout_text(), lines(1, 20));
}

#[tokio::test]
async fn the_received_sequence_survives_a_runner_restart() {
    let mut runner = TestRunner::start().await;
    let ws = runner.workspace("frames-restart");
    let mut client = runner.client().await;
    let mut req = start_request(&ws, "cat-s", &["cat"]);
    req.initial_frames = frames(1, 2);
    client.start_exec(req).await.expect("start");
    // Written (the agent echoed them) before the restart.
    let mut watch = client
        .watch_exec(WatchExecRequest {
            exec_id: "cat-s".into(),
            after_sequence: 0,
        })
        .await
        .expect("watch")
        .into_inner();
    let mut seen = Collected::default();
    while seen.stdout_text() != lines(1, 2) {
        let event = tokio::time::timeout(MINUTE, watch.next())
            .await
            .expect("not echoed")
            .expect("watch ended")
            .expect("watch failed");
        seen.add(event);
    }
    drop(watch);
    runner.restart().await;
    let mut client = runner.client().await;
    assert_eq!(stdin_sequence(&mut client, "cat-s").await, 2);
    assert_eq!(write(&mut client, "cat-s", frames(1, 3)).await, 3);
    close(&mut client, "cat-s").await;
    let out = collect(&mut client, "cat-s", 0, MINUTE).await;
    assert_eq!(out.stdout_text(), lines(1, 3));
}

#[tokio::test]
async fn malformed_stdin_is_refused() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("frames-bad");
    let mut client = runner.client().await;
    let mut both = start_request(&ws, "cat-b", &["cat"]);
    both.initial_stdin = b"raw\n".to_vec();
    both.initial_frames = frames(1, 1);
    let status = client.start_exec(both).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    client
        .start_exec(start_request(&ws, "cat-b", &["cat"]))
        .await
        .expect("start");
    let cases = [
        (b"raw\n".to_vec(), frames(1, 1), "both"),
        (
            Vec::new(),
            [frames(2, 2), frames(1, 1)].concat(),
            "decreasing",
        ),
        (
            Vec::new(),
            [frames(1, 1), frames(1, 1)].concat(),
            "repeated",
        ),
        (Vec::new(), frames(0, 0), "zero"),
    ];
    for (data, frames, case) in cases {
        let status = client
            .write_stdin(WriteStdinRequest {
                exec_id: "cat-b".into(),
                data,
                frames,
                close: false,
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{case}: {status:?}");
    }
    assert_eq!(stdin_sequence(&mut client, "cat-b").await, 0);
    close(&mut client, "cat-b").await;
    let out = collect(&mut client, "cat-b", 0, MINUTE).await;
    assert_eq!(out.stdout_text(), "");
}

/// The runner may write and close an exec's stdin before its supervisor has
/// opened the FIFO: what it wrote must not go with the runner's descriptor.
#[tokio::test]
async fn stdin_written_and_closed_as_the_exec_starts_reaches_it() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("frames-early");
    let client = runner.client().await;
    let starts: Vec<_> = (0..10)
        .map(|n| {
            let mut client = client.clone();
            let ws = ws.clone();
            tokio::spawn(async move {
                let id = format!("cat-e{n}");
                let mut req = start_request(&ws, &id, &["cat"]);
                req.initial_frames = frames(1, 2);
                client.start_exec(req).await.expect("start");
                close(&mut client, &id).await;
                collect(&mut client, &id, 0, MINUTE).await.stdout_text()
            })
        })
        .collect();
    for start in starts {
        assert_eq!(start.await.unwrap(), lines(1, 2));
    }
}
