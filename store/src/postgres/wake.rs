//! Waking watchers on commits made by other replicas.
//!
//! Three sources bump the store's `watch` channels: this replica's own
//! commits (at once, `PgStore::published`); `LISTEN troupe_events`,
//! `troupe_ends` and `troupe_work` on a connection of its own (the writers
//! `NOTIFY` in their transactions, so a notification follows each commit;
//! `troupe_work` names the shards a commit may have made the driver work
//! in, `crate::work`); and, should a notification be lost (the listening
//! connection dropped, and reconnects only after [`RECONNECT_AFTER`]), a
//! poll every [`POLL_EVERY`] of the newest event id and the newest end's,
//! which marks every shard when events moved. Watchers always read the
//! events back from the database, so a spurious wake-up costs one query.

use std::time::Duration;

use sqlx::{
    PgPool,
    postgres::{PgConnectOptions, PgListener, PgPoolOptions},
};
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::{
    error::SessionError,
    shard::ShardSet,
    work::{WorkSignal, parse_shards},
};

/// How often the newest event ids are polled.
pub const POLL_EVERY: Duration = Duration::from_secs(1);
/// How long the listener waits before listening again after losing its
/// connection (the poll covers the gap).
const RECONNECT_AFTER: Duration = Duration::from_secs(2);
/// The `application_name` of the listening connection.
pub const LISTENER_NAME: &str = "troupe-session-listen";

/// The background tasks; they stop when this is dropped.
#[derive(Debug)]
pub(super) struct Tasks {
    _stop: DropGuard,
}

/// Starts the listener and the poller.
pub(super) async fn start(
    pool: &PgPool,
    options: PgConnectOptions,
    events: watch::Sender<u64>,
    ends: watch::Sender<u64>,
    work: WorkSignal,
) -> Result<Tasks, SessionError> {
    let stop = CancellationToken::new();
    let listen_pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(options.application_name(LISTENER_NAME));
    tokio::spawn(listen(
        listen_pool,
        events.clone(),
        ends.clone(),
        work.clone(),
        stop.clone(),
    ));
    let newest = newest(pool).await?;
    tokio::spawn(poll(pool.clone(), newest, events, ends, work, stop.clone()));
    Ok(Tasks {
        _stop: stop.drop_guard(),
    })
}

fn bump(tx: &watch::Sender<u64>) {
    tx.send_modify(|n| *n = n.wrapping_add(1));
}

/// Listens until `stop`, listening again [`RECONNECT_AFTER`] a loss.
async fn listen(
    pool: PgPool,
    events: watch::Sender<u64>,
    ends: watch::Sender<u64>,
    work: WorkSignal,
    stop: CancellationToken,
) {
    loop {
        let listening = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.eager_reconnect(false);
            listener
                .listen_all(["troupe_events", "troupe_ends", "troupe_work"])
                .await?;
            // Listening again after a loss: what was missed meanwhile.
            work.mark(ShardSet::ALL);
            while let Some(note) = listener.try_recv().await? {
                match note.channel() {
                    "troupe_ends" => bump(&ends),
                    "troupe_work" => work.mark(parse_shards(note.payload())),
                    _ => bump(&events),
                }
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

/// The newest event's id and the newest end's.
async fn newest(pool: &PgPool) -> Result<(i64, i64), SessionError> {
    Ok(sqlx::query_as(
        "SELECT (SELECT COALESCE(MAX(id), 0)::bigint FROM events), \
           (SELECT COALESCE(MAX(id), 0)::bigint FROM events \
            WHERE kind IN ('completed', 'failed', 'terminated'))",
    )
    .fetch_one(pool)
    .await?)
}

/// Polls every [`POLL_EVERY`] until `stop`: wakes watchers when the newest
/// ids moved.
async fn poll(
    pool: PgPool,
    mut seen: (i64, i64),
    events: watch::Sender<u64>,
    ends: watch::Sender<u64>,
    work: WorkSignal,
    stop: CancellationToken,
) {
    let mut every = tokio::time::interval(POLL_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stop.cancelled() => return,
        }
        match newest(&pool).await {
            Ok(now) => {
                if now.0 != seen.0 {
                    bump(&events);
                    work.mark(ShardSet::ALL);
                }
                if now.1 != seen.1 {
                    bump(&ends);
                }
                seen = now;
            }
            Err(e) => tracing::warn!(error = %e, "cannot poll the database for new events"),
        }
    }
}
