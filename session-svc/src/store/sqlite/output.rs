//! Agents' output, kept within byte budgets.
//!
//! Each output event is stored with its size, and each session's process
//! row counts the output it keeps (`output_bytes`) and what was dropped.
//! Budgets count bytes as printed; an event holds them as base64, about
//! 4/3 of that on disk.
//! Past a session's budget, the session's oldest output events go until it
//! keeps three quarters of it; past the total budget, the sessions keeping
//! the most lose their oldest output likewise, so a noisy agent cannot push
//! out the output of quiet ones. The output tail (`output_tail`) is kept
//! apart and is never dropped.
//!
//! A drop is never a silent gap: the newest event it drops becomes the
//! session's `output_truncated` event, carrying the totals dropped since the
//! session began, and the session's earlier marker goes. A watcher that
//! resumes at a cursor before any dropped output therefore meets the marker
//! (its cursor is below the newest dropped event), where the output stood.
//!
//! The reads that find output events spell `kind = 'output'` out: the
//! partial index on output events (see the migrations) serves only a query
//! whose condition is that literal.

use sqlx::SqliteConnection;

use troupe_proto::{session::SessionStatus, status::status_str};

use crate::{
    error::SessionError,
    model::{EventDetail, EventKind, Output, OutputTruncated, now_ms},
    store::shared::low_water,
};

/// How much output the store keeps, in bytes printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputBudget {
    /// Bytes of output events one session keeps.
    pub session_bytes: u64,
    /// Bytes of output events kept for all sessions together.
    pub total_bytes: u64,
}

impl Default for OutputBudget {
    fn default() -> Self {
        OutputBudget {
            session_bytes: 4 << 20,
            total_bytes: 256 << 20,
        }
    }
}

/// Records a chunk of a session's output in the open transaction: the
/// tail, the event, the counters, and the drops the budgets call for.
pub(in crate::store) async fn record(
    conn: &mut SqliteConnection,
    session_id: &str,
    stream: &str,
    status: SessionStatus,
    data: &[u8],
    tail_max: usize,
    budget: OutputBudget,
) -> Result<(), SessionError> {
    let bytes = data.len() as i64;
    // The tail is bytes: as a blob, `substr` counts bytes and passes NULs
    // (as text it would count characters and stop at the first NUL).
    let kept: i64 = sqlx::query_scalar(
        "UPDATE processes SET output_tail = substr(CAST(output_tail || ?1 AS BLOB), -?2), \
         output_bytes = output_bytes + ?3 WHERE session_id = ?4 RETURNING output_bytes",
    )
    .bind(data)
    .bind(tail_max as i64)
    .bind(bytes)
    .bind(session_id)
    .fetch_one(&mut *conn)
    .await?;
    let detail = EventDetail::Output(Output::of(stream, data));
    sqlx::query(
        "INSERT INTO events (session_id, seq, kind, status, at_ms, detail, bytes) \
         SELECT session_id, event_seq + 1, ?2, ?3, ?4, ?5, ?6 FROM sessions \
         WHERE session_id = ?1",
    )
    .bind(session_id)
    .bind(EventKind::Output.as_str())
    .bind(status_str(status))
    .bind(now_ms())
    .bind(detail.to_json())
    .bind(bytes)
    .execute(&mut *conn)
    .await?;
    let mut total: i64 = sqlx::query_scalar(
        "UPDATE meta SET value = value + ? WHERE key = 'output_bytes' RETURNING value",
    )
    .bind(bytes)
    .fetch_one(&mut *conn)
    .await?;
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
    conn: &mut SqliteConnection,
    session_id: &str,
    need: i64,
) -> Result<i64, SessionError> {
    let (mut freed, mut count, mut last) = (0i64, 0i64, 0i64);
    'pages: while freed < need {
        let page: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT id, COALESCE(bytes, 0) FROM events \
             WHERE session_id = ?1 AND kind = 'output' AND id > ?2 ORDER BY id LIMIT 256",
        )
        .bind(session_id)
        .bind(last)
        .fetch_all(&mut *conn)
        .await?;
        if page.is_empty() {
            break;
        }
        for (id, bytes) in page {
            freed += bytes;
            count += 1;
            last = id;
            if freed >= need {
                break 'pages;
            }
        }
    }
    if count == 0 {
        return Ok(0);
    }
    sqlx::query("DELETE FROM events WHERE session_id = ?1 AND kind = 'output' AND id < ?2")
        .bind(session_id)
        .bind(last)
        .execute(&mut *conn)
        .await?;
    // The earlier marker: every output before it was dropped already, so
    // the new one, further on, stands for it too (its totals include it).
    sqlx::query(
        "DELETE FROM events WHERE id = \
         (SELECT truncated_event FROM processes WHERE session_id = ?)",
    )
    .bind(session_id)
    .execute(&mut *conn)
    .await?;
    let (dropped_bytes, dropped_events): (i64, i64) = sqlx::query_as(
        "UPDATE processes SET output_bytes = output_bytes - ?2, \
         dropped_bytes = dropped_bytes + ?2, dropped_events = dropped_events + ?3, \
         truncated_event = ?4 WHERE session_id = ?1 RETURNING dropped_bytes, dropped_events",
    )
    .bind(session_id)
    .bind(freed)
    .bind(count)
    .bind(last)
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query("UPDATE events SET kind = ?, bytes = NULL, detail = ? WHERE id = ?")
        .bind(EventKind::OutputTruncated.as_str())
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
    sqlx::query("UPDATE meta SET value = value - ? WHERE key = 'output_bytes'")
        .bind(freed)
        .execute(&mut *conn)
        .await?;
    Ok(freed)
}

/// Takes the output events about to be pruned (ids up to `through`) off the
/// counters, in the pruning's transaction.
pub(super) async fn forget_pruned(
    conn: &mut SqliteConnection,
    through: i64,
) -> Result<(), SessionError> {
    sqlx::query(
        "WITH gone AS (SELECT session_id, SUM(bytes) AS bytes FROM events \
           WHERE id <= ?1 AND kind = 'output' GROUP BY session_id) \
         UPDATE processes SET output_bytes = MAX(0, output_bytes - gone.bytes) FROM gone \
         WHERE processes.session_id = gone.session_id",
    )
    .bind(through)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE meta SET value = MAX(0, value - (SELECT COALESCE(SUM(bytes), 0) FROM events \
           WHERE id <= ?1 AND kind = 'output')) WHERE key = 'output_bytes'",
    )
    .bind(through)
    .execute(&mut *conn)
    .await?;
    Ok(())
}
