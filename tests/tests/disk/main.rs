//! The session service's disk: agents' output kept within byte budgets (per
//! session and in total) with every drop marked where it happened, every
//! byte of the output tail as printed, space the database no longer needs
//! returned to the file system, and the write-ahead log within its limit
//! under output that never pauses.

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use base64::Engine as _;
use sqlx::Connection;
use tokio_util::sync::CancellationToken;
use troupe_session_svc::{
    cursor::Cursor,
    error::QuotaLeft,
    model::{Action, EventFilter, EventRow, ProcessChange, Trust},
    store::{Created, EventPage, Fence, Holder, OutputBudget, SqliteStore, prelude::*},
};
use troupe_tests::stores::{new_session, operator_audit};

mod budgets;
mod space;
mod tail;

const TAIL: usize = 16 << 10;

/// The URL of the database in `dir`.
fn db_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("troupe.db").display())
}

async fn open(dir: &Path, budget: OutputBudget) -> SqliteStore {
    SqliteStore::open(&db_url(dir))
        .await
        .expect("open")
        .with_output_budget(budget)
}

/// A root session whose agent has started (runner event 1).
async fn running(store: &SqliteStore, id: &str) {
    let new = new_session(id, Trust::Direct);
    let audit = operator_audit(Action::CreateRootSession, id);
    let created = store
        .create_root(new, None, audit, &|_| Ok(QuotaLeft::default()))
        .await;
    assert!(matches!(created, Ok(Created::New { .. })));
    let fence = fence(store).await;
    troupe_tests::embedded_runner(store, &fence).await;
    store
        .start_process(&fence, &id.into())
        .await
        .expect("process");
    print(store, id, 1, ProcessChange::Started).await;
}

/// The lease's term for background writes: this test's, taken once.
async fn fence(store: &SqliteStore) -> Fence {
    let holder = Holder::named("tests");
    let ttl = Duration::from_secs(3600);
    if let Some(fence) = store.acquire_lease(&holder, ttl).await.expect("lease") {
        return fence;
    }
    let lease = store.lease().await.expect("lease").expect("held");
    Fence {
        holder: lease.holder,
        shard: lease.shard,
        epoch: lease.epoch,
        ttl,
    }
}

async fn print(store: &SqliteStore, id: &str, seq: u64, change: ProcessChange) {
    let applied = store
        .record_process(&fence(store).await, &id.into(), seq, change, TAIL)
        .await
        .expect("record");
    assert!(applied.is_some(), "runner event {seq} of {id} applied");
}

fn output(data: Vec<u8>) -> ProcessChange {
    ProcessChange::Output {
        stream: "stdout",
        data,
    }
}

/// Chunk `i`: 1 KiB naming its number.
fn chunk(i: u64) -> Vec<u8> {
    let mut data = format!("<{i:06}>").into_bytes();
    data.resize(1024, b'.');
    data
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}
