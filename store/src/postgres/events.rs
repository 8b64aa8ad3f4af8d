//! Writing events in each shard's commit order, pruning them, and the
//! statements every write path shares (audit, request ids).
//!
//! A watcher's cursor holds a position per shard, and it pages
//! `shard_seq > position` in each (`troupe_domain::cursor`). With writers
//! on several connections, positions drawn at insert time would follow the
//! order of the inserts, not of the commits: a transaction that drew 10 and
//! committed after another that drew 11 would be skipped by a watcher that
//! read 11 in between. So every transaction writes its events as its last
//! statements, after moving its shard's counter in `event_shards` (which
//! locks that row until the commit is visible): the next writer of the
//! shard draws its positions, and commits, after it. Commits of one shard
//! are serialised for the time of their last statements and their commit;
//! commits of different shards share no lock, and notify no one from inside
//! (`wake`). Row locks a write needs (the session's `event_seq`) are taken
//! before its shards' rows, the last locks of every transaction, taken in
//! shard order: no cycle can go through them.

use sqlx::PgConnection;

use troupe_proto::status::status_str;

use super::{PgStore, lease};
use crate::{
    error::SessionError,
    model::{Idempotency, now_ms},
    {Fence, Maintenance, UpkeepStore, lease::PRUNED_ACTIONS, shared::earlier_answer},
};

/// The background work's pruning, each pass one fenced transaction.
impl UpkeepStore for PgStore {
    async fn prune_events(&self, fence: &Fence, keep: u64) -> Result<i64, SessionError> {
        retrying!(async {
            let mut tx = self.begin().await?;
            lease::check(&mut tx, fence).await?;
            let pruned = crate::upkeep::postgres::prune_shard(&mut tx, fence.shard, keep).await?;
            tx.commit().await?;
            Ok(pruned)
        })
    }

    async fn prune_request_ids(
        &self,
        fence: &Fence,
        before_ms: i64,
        limit: u32,
    ) -> Result<u64, SessionError> {
        retrying!(async {
            let mut tx = self.begin().await?;
            lease::check(&mut tx, fence).await?;
            let pruned = prune_request_ids(&mut tx, before_ms, limit).await?;
            tx.commit().await?;
            Ok(pruned)
        })
    }

    async fn shard_sessions(&self) -> Result<u64, SessionError> {
        self.fill_shards().await
    }

    /// The store's own upkeep (releases stale
    /// reservations first): none, as PostgreSQL checkpoints by itself and
    /// autovacuum returns what pruning frees.
    async fn maintain(&self) -> Result<Maintenance, SessionError> {
        crate::accounts::release_stale(self).await;
        Ok(Maintenance::default())
    }
}

pub(super) use crate::journal::NewEvent;

/// Writes `events` as the transaction's last statements: each session's
/// sequences (locking its row), then each shard's row of `event_shards`
/// (in shard order), then the ids and the rows. Returns each event's
/// `(id, seq)`, in order. Nothing is notified from here: the counters the
/// shards' rows carry tell the replicas what changed (see `wake`).
pub(super) async fn write(
    conn: &mut PgConnection,
    events: &[NewEvent],
    ended: bool,
) -> Result<Vec<(i64, i64)>, SessionError> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    // Each session's sequences, in the order of its events, and its shard.
    let mut seqs = vec![0i64; events.len()];
    let mut shards = vec![0i32; events.len()];
    let mut done = vec![false; events.len()];
    for i in 0..events.len() {
        if done[i] {
            continue;
        }
        let mine: Vec<usize> = (i..events.len())
            .filter(|&j| events[j].session_id == events[i].session_id)
            .collect();
        let (last, shard) = next_seqs(conn, &events[i].session_id, mine.len()).await?;
        let first = last - mine.len() as i64 + 1;
        for (k, &j) in mine.iter().enumerate() {
            seqs[j] = first + k as i64;
            shards[j] = shard;
            done[j] = true;
        }
    }
    // Each shard's positions, its row locked until the commit: the last
    // lock of the transaction, taken in shard order.
    let mut positions = vec![0i64; events.len()];
    let mut by_shard: Vec<i32> = shards.clone();
    by_shard.sort_unstable();
    by_shard.dedup();
    for shard in by_shard {
        let mine: Vec<usize> = (0..events.len()).filter(|&j| shards[j] == shard).collect();
        let work = mine
            .iter()
            .any(|&j| crate::work::makes_work(events[j].kind));
        let last: i64 = sqlx::query_scalar(
            "UPDATE event_shards SET seq = seq + $2, \
               work_seq = work_seq + CASE WHEN $3 THEN 1 ELSE 0 END, \
               ends_seq = ends_seq + CASE WHEN $4 THEN 1 ELSE 0 END \
             WHERE shard = $1 RETURNING seq",
        )
        .bind(shard)
        .bind(mine.len() as i64)
        .bind(work)
        .bind(ended)
        .fetch_one(&mut *conn)
        .await?;
        let first = last - mine.len() as i64 + 1;
        for (k, &j) in mine.iter().enumerate() {
            positions[j] = first + k as i64;
        }
    }
    // Ids are drawn after the shards' locks, so within a shard they grow
    // in commit order too; the drawing itself takes no lock.
    let mut ids: Vec<i64> =
        sqlx::query_scalar("SELECT nextval('events_id_seq') FROM generate_series(1, $1)")
            .bind(events.len() as i64)
            .fetch_all(&mut *conn)
            .await?;
    ids.sort_unstable();
    let at = now_ms();
    sqlx::query(
        "INSERT INTO events (id, session_id, seq, shard, shard_seq, kind, status, at_ms, detail, bytes) \
         SELECT e.id, e.session_id, e.seq, e.shard, e.shard_seq, e.kind, e.status, $1, e.detail, e.bytes \
         FROM UNNEST($2::bigint[], $3::text[], $4::bigint[], $5::int[], $6::bigint[], $7::text[], \
           $8::text[], $9::text[], $10::bigint[]) \
           AS e(id, session_id, seq, shard, shard_seq, kind, status, detail, bytes)",
    )
    .bind(at)
    .bind(&ids)
    .bind(events.iter().map(|e| e.session_id.as_str()).collect::<Vec<_>>())
    .bind(&seqs)
    .bind(&shards)
    .bind(&positions)
    .bind(events.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>())
    .bind(
        events
            .iter()
            .map(|e| status_str(e.status))
            .collect::<Vec<_>>(),
    )
    .bind(events.iter().map(|e| e.detail.as_str()).collect::<Vec<_>>())
    .bind(events.iter().map(|e| e.bytes).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    Ok(ids.into_iter().zip(seqs).collect())
}

/// Tells the replicas that a commit writing no event may still have made
/// the driver work in `session_id`'s shard (an exit code that landed after
/// its session ended, with a callback due): its shard's work counter moves.
pub(super) async fn touch(conn: &mut PgConnection, session_id: &str) -> Result<(), SessionError> {
    sqlx::query(
        "UPDATE event_shards SET work_seq = work_seq + 1 \
         WHERE shard = (SELECT shard FROM sessions WHERE session_id = $1)",
    )
    .bind(session_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Moves a session's event sequence on by `n` (locking its row); returns
/// the last one and the session's shard, recorded first if the row was
/// written without one (by a release before shards).
async fn next_seqs(
    conn: &mut PgConnection,
    session_id: &str,
    n: usize,
) -> Result<(i64, i32), SessionError> {
    let (last, shard, workspace): (i64, i32, String) = sqlx::query_as(
        "UPDATE sessions SET event_seq = event_seq + $2 WHERE session_id = $1 \
         RETURNING event_seq, shard, workspace_id",
    )
    .bind(session_id)
    .bind(n as i64)
    .fetch_one(&mut *conn)
    .await?;
    if shard >= 0 {
        return Ok((last, shard));
    }
    let shard = i32::from(crate::shard::Shard::of(&workspace).index());
    sqlx::query("UPDATE sessions SET shard = $2 WHERE session_id = $1")
        .bind(session_id)
        .bind(shard)
        .execute(&mut *conn)
        .await?;
    Ok((last, shard))
}

/// Deletes at most `limit` request-id records of callers' calls made
/// before `before_ms`, in the open transaction; returns how many went. A
/// record a claim is taking over meanwhile is rechecked after its lock, and
/// kept.
pub(super) async fn prune_request_ids(
    conn: &mut PgConnection,
    before_ms: i64,
    limit: u32,
) -> Result<u64, SessionError> {
    let done = sqlx::query(
        "DELETE FROM idempotency WHERE created_at_ms < $1 AND (caller, action, request_id) IN \
           (SELECT caller, action, request_id FROM idempotency \
            WHERE created_at_ms < $1 AND action = ANY($2) LIMIT $3)",
    )
    .bind(before_ms)
    .bind(&PRUNED_ACTIONS[..])
    .bind(i64::from(limit))
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// Claims a request id as the first statement of its transaction. `None`:
/// this call is the first (its result is stored by [`remember`] before
/// commit). A concurrent call with the same id waits here until the first
/// one ends: if it committed, its result is returned (or a conflict if the
/// payload differs); if it rolled back (refused), this call goes on as the
/// first. A record made before the key's window has expired: the claim
/// takes it over, and the call is new.
pub(super) async fn claim(
    conn: &mut PgConnection,
    idem: &Idempotency,
) -> Result<Option<serde_json::Value>, SessionError> {
    let inserted = sqlx::query(
        "INSERT INTO idempotency (caller, action, request_id, payload_hash, created_at_ms) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (caller, action, request_id) DO UPDATE \
           SET payload_hash = EXCLUDED.payload_hash, result = NULL, \
             created_at_ms = EXCLUDED.created_at_ms \
           WHERE idempotency.created_at_ms < $6",
    )
    .bind(idem.caller.to_string())
    .bind(idem.action.as_str())
    .bind(&idem.request_id)
    .bind(&idem.payload_hash)
    .bind(now_ms())
    .bind(idem.window_start_ms)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if inserted == 1 {
        return Ok(None);
    }
    let (hash, result): (String, Option<String>) = sqlx::query_as(
        "SELECT payload_hash, result FROM idempotency \
         WHERE caller = $1 AND action = $2 AND request_id = $3",
    )
    .bind(idem.caller.to_string())
    .bind(idem.action.as_str())
    .bind(&idem.request_id)
    .fetch_one(&mut *conn)
    .await?;
    let result = result
        .ok_or_else(|| SessionError::Internal("idempotency record without a result".into()))?;
    earlier_answer(idem, &hash, &result).map(Some)
}

/// Stores the result of the call that claimed `idem`.
pub(super) async fn remember(
    conn: &mut PgConnection,
    idem: Option<&Idempotency>,
    result: serde_json::Value,
) -> Result<(), SessionError> {
    let Some(idem) = idem else { return Ok(()) };
    sqlx::query(
        "UPDATE idempotency SET result = $4 \
         WHERE caller = $1 AND action = $2 AND request_id = $3",
    )
    .bind(idem.caller.to_string())
    .bind(idem.action.as_str())
    .bind(&idem.request_id)
    .bind(result.to_string())
    .execute(conn)
    .await?;
    Ok(())
}
