//! An agent's output through the real pair: every byte it prints reaches
//! what its parent and the operator read of it (GetSession, a SYNC result, a
//! CALLBACK notice), and output past the session service's budget is
//! dropped with the gap marked for watchers, never silently.

use crate::common;

use std::time::Duration;

use common::pair::*;
use tokio_stream::StreamExt;
use troupe_proto::session::{
    EventKind, ExecutionMode, SessionStatus, WatchSessionsRequest, session_event::Detail,
};

/// A NUL hid what followed it from every tail; bytes that are not UTF-8
/// are replaced, as the field's type requires, and nothing after them goes.
#[tokio::test]
async fn every_byte_a_child_prints_reaches_get_session_sync_and_callback() {
    let pair = Pair::start().await;
    let ws = pair.runner.workspace("bytes");
    // The parent prints every line its stdin receives, as it came.
    pair.agent(
        &ws,
        "parent",
        "while read -r line; do printf '%s\\n' \"$line\"; done",
    );
    pair.agent(&ws, "hider", "printf 'shown\\000hidden \\377 end\\n'");
    let printed = "shown\0hidden \u{fffd} end\n";
    let root = pair.root(&ws, "parent", "start").await;
    pair.wait_status(&root.session_id, SessionStatus::Running)
        .await;

    let sync = pair
        .child(&root.session_id, "hider", ExecutionMode::Sync)
        .await;
    assert_eq!(sync.result.unwrap().output_tail, printed);
    let sync_id = sync.session.unwrap().session_id;
    let got = pair.get(&sync_id).await;
    assert_eq!(got.result.unwrap().output_tail, printed);

    let callback = pair
        .child(&root.session_id, "hider", ExecutionMode::Callback)
        .await;
    let callback_id = callback.session.unwrap().session_id;
    let notice = pair.notice_of(&root.session_id, &callback_id).await;
    assert_eq!(notice["session_id"], callback_id.as_str(), "{notice}");
    assert_eq!(notice["output_tail"], printed, "{notice}");
}

/// A watcher that keeps up and one that comes afterwards: each chunk of
/// output either arrives where it was printed or lies behind an
/// `output_truncated` event whose totals say exactly where output resumes.
#[tokio::test]
async fn output_past_the_budget_is_dropped_and_watchers_are_told_where() {
    const BUDGET: u64 = 64 << 10;
    let pair = Pair::start_with(|c| c.output_session_bytes = BUDGET).await;
    let ws = pair.runner.workspace("flood");
    pair.agent(&ws, "flood", "seq 1 150000");
    let printed: String = (1..=150_000).map(|i| format!("{i}\n")).collect();
    let watch = || async {
        pair.server
            .operator()
            .await
            .watch_sessions(WatchSessionsRequest {
                workspace_id: ws.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
    };
    let live = watch().await;
    let root = pair.root(&ws, "flood", "go").await;
    // A watcher that keeps up may be sent every chunk (the drops fall
    // behind it) or meet markers: either way no chunk is out of place.
    read_until_completed(live, &printed).await;
    pair.wait_status(&root.session_id, SessionStatus::Completed)
        .await;

    let afterwards = read_until_completed(watch().await, &printed).await;
    assert_eq!(afterwards.markers, 1, "one marker stands for every drop");
    assert!(
        afterwards.received <= BUDGET as usize,
        "{} bytes kept",
        afterwards.received
    );
}

/// What a watcher was sent of the output.
struct Seen {
    /// Output bytes received.
    received: usize,
    /// `output_truncated` events met.
    markers: usize,
}

/// Reads a watch until the session completes, checking every chunk of
/// output against what was printed at the offset it must stand at.
async fn read_until_completed(
    mut events: tonic::Streaming<troupe_proto::session::SessionEvent>,
    printed: &str,
) -> Seen {
    let printed = printed.as_bytes();
    let mut offset = 0;
    let mut seen = Seen {
        received: 0,
        markers: 0,
    };
    loop {
        let event = next(&mut events).await;
        let kind = event.kind();
        match event.detail {
            Some(Detail::Output(out)) => {
                let end = offset + out.data.len();
                assert!(
                    end <= printed.len() && printed[offset..end] == out.data[..],
                    "output at {offset} is not what was printed there (a silent gap)"
                );
                offset = end;
                seen.received += out.data.len();
            }
            Some(Detail::OutputTruncated(t)) => {
                assert_eq!(kind, EventKind::OutputTruncated);
                let resumes = t.dropped_bytes as usize;
                assert!(
                    resumes >= offset,
                    "a marker never goes back: {resumes} < {offset}"
                );
                assert!(t.dropped_events > 0);
                offset = resumes;
                seen.markers += 1;
            }
            _ => {}
        }
        if kind == EventKind::Completed {
            assert_eq!(
                offset,
                printed.len(),
                "the output ends where the agent's did"
            );
            return seen;
        }
    }
}

/// Output the runner's log dropped, past its bound, while the session
/// service was down reaches watchers as a gap marked where it is
/// (`by_runner`), never a silent one, and what follows it is intact.
#[tokio::test]
async fn output_the_runner_dropped_while_the_service_was_down_is_marked() {
    let mut pair = Pair::start_on(
        |runner| {
            runner.exec_log_max_mib = 1;
            runner.output_window_kib = 2048;
        },
        |_| {},
    )
    .await;
    let ws = pair.runner.workspace("gap");
    // Prints 4 MiB and a last line once the test says go.
    pair.agent(
        &ws,
        "chatty",
        "while [ ! -e /workspace/go ]; do sleep 0.05; done; \
         head -c 4194304 /dev/zero | tr '\\0' x; echo; echo last line",
    );
    let printed = format!("{}\nlast line\n", "x".repeat(4 << 20));
    let root = pair.root(&ws, "chatty", "go").await;
    pair.wait_status(&root.session_id, SessionStatus::Running)
        .await;

    pair.server.stop_for_restart().await;
    std::fs::write(pair.runner.config.workspaces_dir().join(&ws).join("go"), "").unwrap();
    let mut runner = pair.runner.client().await;
    let deadline = tokio::time::Instant::now() + MINUTE;
    while common::list_execs(&mut runner)
        .await
        .iter()
        .any(|e| e.exec_id == root.session_id && e.exit.is_none())
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the agent never ended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pair.server.start_again().await;
    pair.wait_status(&root.session_id, SessionStatus::Completed)
        .await;

    let mut events = pair.watch(&root.session_id).await;
    let (mut before, mut after, mut marker) = (Vec::new(), Vec::new(), None);
    loop {
        let event = next(&mut events).await;
        let kind = event.kind();
        match event.detail {
            Some(Detail::Output(out)) if marker.is_none() => before.extend(out.data),
            Some(Detail::Output(out)) => after.extend(out.data),
            Some(Detail::OutputTruncated(t)) => {
                assert!(marker.is_none(), "one gap, one marker");
                marker = Some(t);
            }
            _ => {}
        }
        if kind == EventKind::Completed {
            break;
        }
    }
    let marker = marker.expect("the gap is marked");
    assert!(marker.by_runner, "{marker:?}");
    assert!(
        marker.dropped_events > 0 && marker.dropped_bytes > 0,
        "{marker:?}"
    );
    assert!(
        printed.as_bytes().starts_with(&before),
        "what came before the gap is what was printed first"
    );
    assert!(
        !after.is_empty() && printed.as_bytes().ends_with(&after),
        "what follows the gap is the end of what was printed, whole ({} bytes)",
        after.len()
    );
    assert!(
        after.len() < printed.len() - before.len(),
        "something was dropped"
    );
}

/// The next event of a watch, which must come within a minute.
async fn next(
    events: &mut tonic::Streaming<troupe_proto::session::SessionEvent>,
) -> troupe_proto::session::SessionEvent {
    tokio::time::timeout(MINUTE, events.next())
        .await
        .expect("an event within a minute")
        .expect("the watch goes on")
        .expect("an event")
}
