//! Waking watchers and drivers after commits, here and on other replicas,
//! with no lock in any commit's path.
//!
//! What changed is read, not told: each shard's row of `event_shards`
//! counts its events (`seq`), the commits that may have made the driver
//! work (`work_seq`) and those that ended sessions (`ends_seq`), moved by
//! the writes themselves under the shard's lock (`events::write`). One task
//! per replica, the *reader*, reads the 64 rows and compares them with what
//! it saw last: the shards whose events moved wake their watchers
//! (`changes`), those whose work moved their driver (`work`), and any end
//! the watchers of ends.
//!
//! The reader reads when prompted: after every commit here
//! (`PgStore::committed`), on a `troupe_commits` notification from another
//! replica, and every [`POLL_EVERY`] in case a notification was lost.
//! After reading for a commit of its own that moved anything it sends
//! `NOTIFY troupe_commits` (no payload) itself, in a statement of its own:
//! a `NOTIFY` inside a transaction makes its commit take PostgreSQL's one
//! notification lock, which would serialise every event-writing commit of
//! the fleet again. Reads are at least [`MIN_GAP`] apart, so a busy fleet
//! costs each replica a few hundred small reads a second at most, and the
//! prompts that arrive meanwhile are answered by one read. A lost
//! notification, or a listener that reconnects, loses nothing: the next
//! read compares counters.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use sqlx::{
    PgPool,
    postgres::{PgConnectOptions, PgListener, PgPoolOptions},
};
use tokio::sync::{Notify, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::{
    changes::Changes,
    error::SessionError,
    shard::{SHARDS, Shard, ShardSet},
    work::WorkSignal,
};

/// How often the counters are read with no prompt.
pub const POLL_EVERY: Duration = Duration::from_secs(1);
/// The least time between two reads of the counters.
const MIN_GAP: Duration = Duration::from_millis(2);
/// How long the listener waits before listening again after losing its
/// connection (the poll covers the gap).
const RECONNECT_AFTER: Duration = Duration::from_secs(2);
/// The `application_name` of the listening connection.
pub const LISTENER_NAME: &str = "troupe-session-listen";
/// The channel replicas prompt one another on.
const CHANNEL: &str = "troupe_commits";

/// The background tasks (they stop when this is dropped), and the prompt a
/// commit here gives the reader.
#[derive(Debug)]
pub(super) struct Tasks {
    prompt: Arc<Prompt>,
    _stop: DropGuard,
}

impl Tasks {
    /// Prompts the reader after a commit here.
    pub(super) fn committed(&self) {
        self.prompt.local.store(true, Ordering::Release);
        self.prompt.notify.notify_one();
    }
}

#[derive(Debug, Default)]
struct Prompt {
    notify: Notify,
    /// Whether a commit here came since the last read: the replicas are
    /// told after the read.
    local: AtomicBool,
}

/// What the reader wakes.
pub(super) struct Wakes {
    pub changes: Changes,
    pub ends: watch::Sender<u64>,
    pub work: WorkSignal,
}

/// Starts the listener and the reader.
pub(super) async fn start(
    pool: &PgPool,
    options: PgConnectOptions,
    wakes: Wakes,
) -> Result<Tasks, SessionError> {
    let stop = CancellationToken::new();
    let prompt = Arc::new(Prompt::default());
    let listen_pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(options.application_name(LISTENER_NAME));
    tokio::spawn(listen(listen_pool, prompt.clone(), stop.clone()));
    let seen = Counters::read(pool).await?;
    tokio::spawn(read(
        pool.clone(),
        seen,
        wakes,
        prompt.clone(),
        stop.clone(),
    ));
    Ok(Tasks {
        prompt,
        _stop: stop.drop_guard(),
    })
}

/// Listens until `stop`, listening again [`RECONNECT_AFTER`] a loss.
async fn listen(pool: PgPool, prompt: Arc<Prompt>, stop: CancellationToken) {
    loop {
        let listening = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.eager_reconnect(false);
            listener.listen(CHANNEL).await?;
            // Listening again after a loss: what was missed meanwhile.
            prompt.notify.notify_one();
            while listener.try_recv().await?.is_some() {
                prompt.notify.notify_one();
            }
            Ok::<(), sqlx::Error>(())
        };
        tokio::select! {
            result = listening => match result {
                Ok(()) => tracing::warn!("lost the database connection that listens for commits"),
                Err(e) => tracing::warn!(error = %e, "cannot listen for commits on the database"),
            },
            () = stop.cancelled() => return,
        }
        tokio::select! {
            () = tokio::time::sleep(RECONNECT_AFTER) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// Each shard's counters, as last read.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Counters {
    seq: [i64; SHARDS as usize],
    work: [i64; SHARDS as usize],
    ends: [i64; SHARDS as usize],
}

impl Counters {
    async fn read(pool: &PgPool) -> Result<Counters, SessionError> {
        let rows: Vec<(i32, i64, i64, i64)> =
            sqlx::query_as("SELECT shard, seq, work_seq, ends_seq FROM event_shards")
                .fetch_all(pool)
                .await?;
        let mut counters = Counters {
            seq: [0; SHARDS as usize],
            work: [0; SHARDS as usize],
            ends: [0; SHARDS as usize],
        };
        for (shard, seq, work, ends) in rows {
            if let Some(i) = u16::try_from(shard).ok().filter(|&n| n < SHARDS) {
                let i = usize::from(i);
                (counters.seq[i], counters.work[i], counters.ends[i]) = (seq, work, ends);
            }
        }
        Ok(counters)
    }

    /// The shards whose events, work and ends moved since `before`.
    fn moved(&self, before: &Counters) -> (ShardSet, ShardSet, bool) {
        let mut events = ShardSet::default();
        let mut work = ShardSet::default();
        let mut ends = false;
        for shard in Shard::all() {
            let i = usize::from(shard.index());
            if self.seq[i] != before.seq[i] {
                events.insert(shard);
            }
            if self.work[i] != before.work[i] {
                work.insert(shard);
            }
            ends |= self.ends[i] != before.ends[i];
        }
        (events, work, ends)
    }
}

/// Reads the counters when prompted, or every [`POLL_EVERY`], until `stop`.
async fn read(
    pool: PgPool,
    mut seen: Counters,
    wakes: Wakes,
    prompt: Arc<Prompt>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = prompt.notify.notified() => {}
            () = tokio::time::sleep(POLL_EVERY) => {}
            () = stop.cancelled() => return,
        }
        let local = prompt.local.swap(false, Ordering::AcqRel);
        match Counters::read(&pool).await {
            Ok(now) => {
                let (events, work, ends) = now.moved(&seen);
                seen = now;
                wakes.changes.mark(events);
                if !work.is_empty() {
                    wakes.work.mark(work);
                }
                if ends {
                    wakes.ends.send_modify(|n| *n = n.wrapping_add(1));
                }
                let moved = !events.is_empty() || !work.is_empty() || ends;
                if local && moved {
                    let told = sqlx::query("SELECT pg_notify($1, '')")
                        .bind(CHANNEL)
                        .execute(&pool)
                        .await;
                    if let Err(e) = told {
                        tracing::warn!(error = %e, "cannot tell the other replicas of a commit");
                    }
                }
            }
            Err(e) => {
                // The next read compares with what was seen last: nothing is lost.
                prompt.local.fetch_or(local, Ordering::AcqRel);
                tracing::warn!(error = %e, "cannot read the shards' counters");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(MIN_GAP) => {}
            () = stop.cancelled() => return,
        }
    }
}
