//! Several real `troupe-session` processes on one PostgreSQL database, each
//! with `--runner`, driving one real runner (PostgreSQL only: run under
//! `scripts/pg-env`; the binary comes from `cargo build -p
//! troupe-session-svc`). One owns the background work at a time; when it is
//! killed (SIGKILL) another takes over within a few seconds and nothing is
//! lost or repeated (an owner paused past its lease: `paused_owner.rs`).
//! The fence keeps the old owner's writes out of the new term, so the new
//! owner's cursor is where the old one stopped; the same output offered
//! again in the new term, as a follower from an older cursor would, is
//! staged by the test, and each runner sequence is still applied once.

use crate::common;

use std::time::Duration;

use common::{
    MINUTE, TestRunner, direct_root,
    replicas::{
        LEASE_TTL, LINES, assert_each_line_once, balanced, end_and_stop, low_workspace, output,
        output_with, replica, shard_lease, status, taken_over, until,
    },
};
use futures::StreamExt;
use troupe_proto::{
    runner::{OutputStream, WatchExecRequest, exec_event},
    session::{CreateSessionRequest, ExecutionMode, SessionStatus},
};
use troupe_session_svc::{
    model::ProcessChange,
    store::{Fence, Lease, PgStore, prelude::*},
};

/// What a new owner that re-followed from an older cursor than the one
/// the old owner left would do: the runner's output of `session`, from
/// its first sequence through the last one applied, offered to the store
/// again under the live term's fence (`lease`). Every one of those runner
/// sequences was written already: returns those the store applied again.
async fn reoffer_written_output(
    store: &PgStore,
    runner: &TestRunner,
    lease: &Lease,
    session: &str,
) -> Vec<u64> {
    let fence = Fence {
        holder: lease.holder.clone(),
        shard: lease.shard,
        epoch: lease.epoch,
        ttl: LEASE_TTL,
    };
    let written = store
        .process(&session.into())
        .await
        .unwrap()
        .expect("the session's process")
        .runner_seq;
    let mut events = runner
        .client()
        .await
        .watch_exec(WatchExecRequest {
            exec_id: session.to_owned(),
            after_sequence: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut offered = 0;
    let mut again = Vec::new();
    while let Some(event) = events.next().await {
        let event = event.unwrap();
        if event.sequence > written {
            break;
        }
        if let Some(exec_event::Event::Output(out)) = &event.event {
            let change = ProcessChange::Output {
                stream: if out.stream() == OutputStream::Stderr {
                    "stderr"
                } else {
                    "stdout"
                },
                data: out.data.clone(),
            };
            let applied = store
                .record_process(&fence, &session.into(), event.sequence, change, 4096)
                .await
                .unwrap();
            if applied.is_some() {
                again.push(event.sequence);
            }
            offered += 1;
        }
        if event.sequence == written {
            break;
        }
    }
    assert!(
        offered >= 20,
        "only {offered} written outputs offered again"
    );
    again
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owner_is_taken_over_and_nothing_is_lost_or_repeated() {
    let url = troupe_tests::postgres::fresh_database().await;
    let runner = TestRunner::driven().await;
    let endpoint = format!("http://{}", runner.addr);
    let store = PgStore::open(&url).await.unwrap();
    let first = replica(&url, &endpoint);
    balanced(&store, 1).await;
    let second = replica(&url, &endpoint);
    balanced(&store, 2).await;
    let workspace = low_workspace(&runner, "takeover");
    let held = shard_lease(&store, &workspace).await;
    assert_eq!(held.holder.pid(), Some(first.pid()), "the first keeps it");
    let mut via_second = second.operator().await;
    // Created through the replica that does not own: the owner starts it.
    let root = direct_root(&mut via_second, &workspace, "printer", "first")
        .await
        .session_id;
    // A CALLBACK child whose end falls after the kill.
    let child = via_second
        .create_session(CreateSessionRequest {
            title: "brief".into(),
            agent_name: "brief".into(),
            initial_message: "go".into(),
            parent_session_id: root.clone(),
            mode: ExecutionMode::Callback as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap()
        .session_id;
    output_with(&store, &root, "line20\n", "the root never printed").await;
    // Killed mid-output; a message sent in the gap.
    first.kill();
    let killed_at = tokio::time::Instant::now();
    via_second
        .send_message(troupe_tests::message(&root, "in the gap"))
        .await
        .unwrap();
    let taken = taken_over(&store, &held, Duration::from_secs(10)).await;
    assert!(
        killed_at.elapsed() < Duration::from_secs(5),
        "took over late"
    );
    assert_ne!(taken.holder, held.holder);
    let again = reoffer_written_output(&store, &runner, &taken, &root).await;
    let out = until("the root's output never completed", MINUTE, || async {
        let out = output(&store, &root).await;
        (out.contains(&format!("line{LINES}\n"))
            && out.contains("in the gap")
            && out.contains("session_ended"))
        .then_some(out)
    })
    .await;
    assert_each_line_once(&out);
    assert!(
        again.is_empty(),
        "runner sequences applied again: {again:?}"
    );
    assert_eq!(out.matches("in the gap").count(), 1, "{out}");
    assert_eq!(out.matches("\"first\"").count(), 1, "{out}");
    // The child's notice, once, however its end fell.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let out = output(&store, &root).await;
    assert_eq!(
        out.matches(&child).count(),
        1,
        "one notice of {child}: {out}"
    );
    assert_eq!(
        status(&mut via_second, &child).await,
        SessionStatus::Completed
    );
    end_and_stop(&mut via_second, &root, second).await;
}
