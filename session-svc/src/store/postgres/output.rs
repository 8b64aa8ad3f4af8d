//! Agents' output, kept within byte budgets: the same rules as SQLite's
//! (`store/sqlite/output.rs`): past a session's budget its oldest output
//! events go until it keeps three quarters of it; past the total, the
//! sessions keeping the most lose theirs likewise; the newest event a drop
//! takes becomes the session's `output_truncated` marker. The total is the
//! `meta` row `output_bytes`, which every output write locks first, so
//! output writes (and pruning) take their turns at it.

use sqlx::PgConnection;
use troupe_proto::session::SessionStatus;

use super::events::{self, NewEvent};
use crate::{
    error::SessionError,
    model::{EventDetail, EventKind, Output, OutputTruncated},
    store::{OutputBudget, shared::low_water},
};

/// Locks the total's row: the first lock of an output write or a pruning.
pub(super) async fn lock_total(conn: &mut PgConnection) -> Result<(), SessionError> {
    sqlx::query("SELECT value FROM meta WHERE key = 'output_bytes' FOR NO KEY UPDATE")
        .execute(conn)
        .await?;
    Ok(())
}

/// Records a chunk of a session's output in the open transaction (which
/// holds the total's lock): the tail, the event, the counters, and the
/// drops the budgets call for.
pub(in crate::store) async fn record(
    conn: &mut PgConnection,
    session_id: &str,
    stream: &str,
    status: SessionStatus,
    data: &[u8],
    tail_max: usize,
    budget: OutputBudget,
) -> Result<(), SessionError> {
    let bytes = data.len() as i64;
    // The tail's last `tail_max` bytes (bytea counts bytes).
    let kept: i64 = sqlx::query_scalar(
        "UPDATE processes SET \
           output_tail = substring(output_tail || $1 FROM \
             GREATEST(1, length(output_tail || $1) - $2::int + 1)::int), \
           output_bytes = output_bytes + $3 WHERE session_id = $4 RETURNING output_bytes",
    )
    .bind(data)
    .bind(tail_max.min(i32::MAX as usize) as i32)
    .bind(bytes)
    .bind(session_id)
    .fetch_one(&mut *conn)
    .await?;
    let mut total: i64 = sqlx::query_scalar(
        "UPDATE meta SET value = value + $1 WHERE key = 'output_bytes' RETURNING value",
    )
    .bind(bytes)
    .fetch_one(&mut *conn)
    .await?;
    let detail = EventDetail::Output(Output::of(stream, data));
    let event = NewEvent {
        bytes: Some(bytes),
        ..NewEvent::new(session_id, EventKind::Output, status, &detail)
    };
    events::write(&mut *conn, &[event], false).await?;
    if kept as u64 > budget.session_bytes {
        total -= drop_oldest(conn, session_id, kept - low_water(budget.session_bytes)).await?;
    }
    while total > 0 && total as u64 > budget.total_bytes {
        let largest: Option<(String, i64)> = sqlx::query_as(
            "SELECT session_id, output_bytes FROM processes WHERE output_bytes > 0 \
             ORDER BY output_bytes DESC LIMIT 1",
        )
        .fetch_optional(&mut *conn)
        .await?;
        let Some((largest, kept)) = largest else {
            break;
        };
        let need = (total - low_water(budget.total_bytes)).min(kept);
        let freed = drop_oldest(conn, &largest, need).await?;
        if freed == 0 {
            break;
        }
        total -= freed;
    }
    Ok(())
}

/// Drops a session's oldest output events, at least `need` bytes of them
/// (all it keeps, if fewer), and moves its `output_truncated` event to the
/// newest one dropped. Returns the bytes dropped.
async fn drop_oldest(
    conn: &mut PgConnection,
    session_id: &str,
    need: i64,
) -> Result<i64, SessionError> {
    // The oldest events whose running sum first reaches `need`.
    let (freed, count, last): (Option<i64>, i64, Option<i64>) = sqlx::query_as(
        "WITH o AS (SELECT id, COALESCE(bytes, 0) AS b, \
             SUM(COALESCE(bytes, 0)) OVER (ORDER BY id) AS run FROM events \
           WHERE session_id = $1 AND kind = 'output'), \
         upto AS (SELECT COALESCE(MIN(id) FILTER (WHERE run >= $2), MAX(id)) AS id FROM o) \
         SELECT SUM(b)::bigint, COUNT(*), MAX(id) FROM o WHERE id <= (SELECT id FROM upto)",
    )
    .bind(session_id)
    .bind(need)
    .fetch_one(&mut *conn)
    .await?;
    let (Some(freed), Some(last)) = (freed, last) else {
        return Ok(0);
    };
    if count == 0 {
        return Ok(0);
    }
    sqlx::query("DELETE FROM events WHERE session_id = $1 AND kind = 'output' AND id < $2")
        .bind(session_id)
        .bind(last)
        .execute(&mut *conn)
        .await?;
    // The earlier marker: every output before it was dropped already.
    sqlx::query(
        "DELETE FROM events WHERE id = \
         (SELECT truncated_event FROM processes WHERE session_id = $1)",
    )
    .bind(session_id)
    .execute(&mut *conn)
    .await?;
    let (dropped_bytes, dropped_events): (i64, i64) = sqlx::query_as(
        "UPDATE processes SET output_bytes = output_bytes - $2, \
         dropped_bytes = dropped_bytes + $2, dropped_events = dropped_events + $3, \
         truncated_event = $4 WHERE session_id = $1 RETURNING dropped_bytes, dropped_events",
    )
    .bind(session_id)
    .bind(freed)
    .bind(count)
    .bind(last)
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE events SET kind = 'output_truncated', bytes = NULL, detail = $1 WHERE id = $2",
    )
    .bind(
        EventDetail::OutputTruncated(OutputTruncated {
            dropped_bytes: dropped_bytes as u64,
            dropped_events: dropped_events as u64,
            by_runner: false,
        })
        .to_json(),
    )
    .bind(last)
    .execute(&mut *conn)
    .await?;
    sqlx::query("UPDATE meta SET value = value - $1 WHERE key = 'output_bytes'")
        .bind(freed)
        .execute(&mut *conn)
        .await?;
    Ok(freed)
}
