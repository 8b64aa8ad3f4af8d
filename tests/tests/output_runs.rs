//! A run of output applied in one write (`ProcessStore::record_outputs`,
//! what the follower sends when the runner's events come faster than one
//! write each), on both backends alike: every chunk's bytes in order, a
//! stream's consecutive chunks joined in events of at most
//! `OUTPUT_EVENT_BYTES`, the tail and the counts as if each chunk had been
//! written alone, a run out of order refused, a run or
//! part of one applied before skipped, the budgets kept with every drop
//! marked, and nothing written under a fence that is not the lease's.
//!
//! PostgreSQL too: `TROUPE_TEST_POSTGRES_URL` (`source scripts/pg-env`).

use base64::Engine as _;
use troupe_session_svc::{
    error::QuotaLeft,
    model::{Action, EventFilter, EventRow, OutputChunk, Trust},
    store::{EventPage, Fence, OUTPUT_EVENT_BYTES, OutputBudget, prelude::*},
};
use troupe_tests::stores::{self, operator_audit};

const TAIL: usize = 100;

/// Chunks `from..=through`, each runner event `n` printing 1 KiB that
/// names `n`.
fn run(from: u64, through: u64) -> Vec<OutputChunk> {
    (from..=through)
        .map(|n| {
            let mut data = format!("<{n:04}>").into_bytes();
            data.resize(1024, b'a' + (n % 26) as u8);
            OutputChunk {
                runner_seq: n,
                stream: if n % 2 == 0 { "stdout" } else { "stderr" },
                data,
            }
        })
        .collect()
}

/// Every event of `id`, in cursor order.
async fn events<S: Store>(store: &S, id: &str) -> Vec<EventRow> {
    let filter = EventFilter {
        session_id: Some(id.into()),
        ..Default::default()
    };
    let EventPage::Events(page) = store
        .events_after(&filter, &Default::default(), 10_000)
        .await
        .unwrap()
    else {
        panic!("cursor expired");
    };
    page
}

/// The chunks a watcher of `id` is sent: runner numbers and streams.
async fn shown<S: Store>(store: &S, id: &str) -> Vec<(u64, String)> {
    events(store, id)
        .await
        .iter()
        .filter(|e| e.kind.as_str() == "output")
        .map(|e| {
            let detail: serde_json::Value = serde_json::from_str(&e.detail).unwrap();
            let data = base64::engine::general_purpose::STANDARD
                .decode(detail["data"].as_str().unwrap())
                .unwrap();
            let n = std::str::from_utf8(&data[1..5]).unwrap().parse().unwrap();
            assert_eq!(data, run(n, n)[0].data, "chunk {n} whole");
            (n, detail["stream"].as_str().unwrap().to_owned())
        })
        .collect()
}

fn expected(numbers: impl IntoIterator<Item = u64>) -> Vec<(u64, String)> {
    numbers
        .into_iter()
        .map(|n| (n, run(n, n)[0].stream.to_owned()))
        .collect()
}

/// A started root `id`, and the lease's fence.
async fn started<S: Store>(store: &S, id: &str) -> Fence {
    let fence = stores::fence(store).await;
    store
        .create_root(
            stores::new_session(id, Trust::Direct),
            None,
            operator_audit(Action::CreateRootSession, id),
            &|_| Ok(QuotaLeft::default()),
        )
        .await
        .expect("root");
    stores::started(store, &fence, id).await;
    fence
}

async fn contract<S: Store>(store: S) {
    let fence = started(&store, "s").await;
    let id = "s".into();
    let applied = store
        .record_outputs(&fence, &id, &run(2, 6), TAIL)
        .await
        .unwrap();
    assert_eq!(applied, 5);
    assert_eq!(shown(&store, "s").await, expected(2..=6));

    // The same run again (a follower that reconnected), then one that
    // overlaps what was applied: only what is new is written.
    let again = store.record_outputs(&fence, &id, &run(2, 6), TAIL).await;
    assert_eq!(again.unwrap(), 0);
    let overlap = store.record_outputs(&fence, &id, &run(5, 8), TAIL).await;
    assert_eq!(overlap.unwrap(), 2);
    assert_eq!(shown(&store, "s").await, expected(2..=8));

    // The tail and the runner's position are those of chunk 8 last.
    let process = store.process(&id).await.unwrap().unwrap();
    assert_eq!(process.runner_seq, 8);
    let last = &run(8, 8)[0].data;
    assert_eq!(process.output_tail, last[last.len() - TAIL..]);

    // A run out of runner order is refused whole.
    let mut shuffled = run(9, 11);
    shuffled.swap(0, 2);
    let refused = store.record_outputs(&fence, &id, &shuffled, TAIL).await;
    assert!(refused.is_err(), "a run out of order: {refused:?}");
    assert_eq!(shown(&store, "s").await, expected(2..=8));

    // A run under another term's fence writes nothing.
    let stale = Fence {
        epoch: fence.epoch + 1,
        ..fence.clone()
    };
    let refused = store.record_outputs(&stale, &id, &run(9, 10), TAIL).await;
    assert!(refused.is_err(), "a stale fence's run: {refused:?}");
    assert_eq!(shown(&store, "s").await, expected(2..=8));
    assert_eq!(store.process(&id).await.unwrap().unwrap().runner_seq, 8);
}

/// A run of one stream: its chunks joined, in events of at most
/// `OUTPUT_EVENT_BYTES`, every byte in order.
async fn joins<S: Store>(store: S) {
    let fence = started(&store, "j").await;
    let chunks: Vec<OutputChunk> = (2..102)
        .map(|n| OutputChunk {
            runner_seq: n,
            stream: "stdout",
            data: vec![n as u8; 1024],
        })
        .collect();
    let applied = store
        .record_outputs(&fence, &"j".into(), &chunks, TAIL)
        .await
        .unwrap();
    assert_eq!(applied, 100);
    let outputs: Vec<Vec<u8>> = events(&store, "j")
        .await
        .iter()
        .filter(|e| e.kind.as_str() == "output")
        .map(|e| {
            let detail: serde_json::Value = serde_json::from_str(&e.detail).unwrap();
            assert_eq!(detail["stream"], "stdout");
            base64::engine::general_purpose::STANDARD
                .decode(detail["data"].as_str().unwrap())
                .unwrap()
        })
        .collect();
    let sizes: Vec<usize> = outputs.iter().map(Vec::len).collect();
    assert_eq!(sizes, [OUTPUT_EVENT_BYTES, 100 * 1024 - OUTPUT_EVENT_BYTES]);
    let printed: Vec<u8> = chunks.iter().flat_map(|c| c.data.clone()).collect();
    assert_eq!(outputs.concat(), printed);
}

/// Runs past the session's budget (8 KiB): the oldest chunks go, a marker
/// stands where they were with the totals, and what is kept stays within
/// the budget after every run.
async fn budgets<S: Store>(store: S) {
    let fence = started(&store, "b").await;
    let id = "b".into();
    for (from, through) in [(2, 7), (8, 13), (14, 19)] {
        store
            .record_outputs(&fence, &id, &run(from, through), TAIL)
            .await
            .unwrap();
        let kept = shown(&store, "b").await;
        assert!(kept.len() <= 8, "within 8 KiB after {through}: {kept:?}");
        assert_eq!(kept.last().unwrap().0, through, "the newest kept");
    }
    let all = events(&store, "b").await;
    let marker = all
        .iter()
        .position(|e| e.kind.as_str() == "output_truncated")
        .expect("a marker");
    let first_kept = all.iter().position(|e| e.kind.as_str() == "output");
    assert!(Some(marker) < first_kept, "the marker before what is kept");
    let detail: serde_json::Value = serde_json::from_str(&all[marker].detail).unwrap();
    let kept = shown(&store, "b").await;
    let dropped = 18 - kept.len() as u64;
    assert_eq!(detail["dropped_events"], dropped);
    assert_eq!(detail["dropped_bytes"], dropped * 1024);
    assert_eq!(kept, expected(2 + dropped..=19));
}

const BUDGET: OutputBudget = OutputBudget {
    session_bytes: 8 << 10,
    total_bytes: 1 << 20,
};

#[tokio::test]
async fn a_run_of_output_is_written_once_on_sqlite() {
    let (_dir, store) = stores::sqlite().await;
    contract(store).await;
    let (_dir, store) = stores::sqlite().await;
    budgets(store.with_output_budget(BUDGET)).await;
    let (_dir, store) = stores::sqlite().await;
    joins(store).await;
}

#[tokio::test]
async fn a_run_of_output_is_written_once_on_postgres() {
    contract(stores::postgres().await).await;
    budgets(stores::postgres().await.with_output_budget(BUDGET)).await;
    joins(stores::postgres().await).await;
}
