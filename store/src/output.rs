//! Agents' output, kept within byte budgets, written once for both
//! backends (see `backends`).
//!
//! A run of chunks written at once is stored as fewer events: consecutive
//! chunks of a stream joined up to [`OUTPUT_EVENT_BYTES`] (`joined`).
//! Each output event is stored with its size, and each session's process
//! row counts the output it keeps (`output_bytes`) and what was dropped.
//! Budgets count bytes as printed; an event holds them as base64, about
//! 4/3 of that on disk.
//! Past a session's budget, the session's oldest output events go until it
//! keeps three quarters of it; past the total budget, the sessions keeping
//! the most lose their oldest output likewise, so a noisy agent cannot push
//! out the output of quiet ones. The total is kept in stripes, one per
//! shard (`output_stripes`), each write adding to its own shard's: output
//! of different shards takes no common lock. A write reads the other
//! stripes as committed, so writes of other shards in flight at the same
//! moment may pass the total by what they add, until the next write drops
//! it back. The output tail (`output_tail`) is kept
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

use super::backends::each_backend;

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

/// The stripe of the output total a session's writes count in: its shard's
/// (shard 0's for a session of a release before shards). The stripes are
/// only ever summed, so a drop may take its bytes off any stripe: it takes
/// them off the writer's, the one it holds.
pub(crate) const STRIPE_OF: &str =
    "SELECT CASE WHEN shard < 0 THEN 0 ELSE shard END FROM sessions WHERE session_id = $1";

/// The most bytes of output one event holds when chunks are joined: the
/// runner's largest chunk, so no event is larger than one chunk could be.
pub const OUTPUT_EVENT_BYTES: usize = 64 << 10;

/// The chunks as events: consecutive chunks of one stream joined, up to
/// [`OUTPUT_EVENT_BYTES`] an event (a larger chunk stands alone). A
/// watcher is sent the same bytes in the same order, in fewer events.
pub(crate) fn joined(chunks: &[crate::model::OutputChunk]) -> Vec<(&'static str, Vec<u8>)> {
    let mut events: Vec<(&'static str, Vec<u8>)> = Vec::new();
    for chunk in chunks {
        match events.last_mut() {
            Some((stream, data))
                if *stream == chunk.stream
                    && data.len() + chunk.data.len() <= OUTPUT_EVENT_BYTES =>
            {
                data.extend_from_slice(&chunk.data)
            }
            _ => events.push((chunk.stream, chunk.data.clone())),
        }
    }
    events
}

/// The last `max` bytes of the chunks' data, joined.
pub(crate) fn tail_of(chunks: &[crate::model::OutputChunk], max: usize) -> Vec<u8> {
    let mut parts = Vec::new();
    let mut need = max;
    for chunk in chunks.iter().rev() {
        if need == 0 {
            break;
        }
        let take = chunk.data.len().min(need);
        parts.push(&chunk.data[chunk.data.len() - take..]);
        need -= take;
    }
    parts.into_iter().rev().flatten().copied().collect()
}

each_backend! {
    use troupe_proto::session::SessionStatus;

    use crate::{
        error::SessionError,
        model::{EventDetail, EventKind, Output, OutputChunk, OutputTruncated},
        {OutputBudget, journal::NewEvent, output::{STRIPE_OF, joined, tail_of}, shared::low_water},
    };

    impl This {
        /// Records chunks of a session's output in the open transaction
        /// (on PostgreSQL it holds its stripe's lock, taken first): the
        /// tail, the total, the events (`joined`), and the drops the budgets
        /// call for. Drops past the total come after the events, under
        /// PostgreSQL's lock of the shard's events: the one write that
        /// leaves the lock order.
        pub(crate) async fn record_output(
            conn: &mut Conn,
            session_id: &str,
            status: SessionStatus,
            chunks: &[OutputChunk],
            tail_max: usize,
            budget: OutputBudget,
        ) -> Result<(), SessionError> {
            let printed: usize = chunks.iter().map(|c| c.data.len()).sum();
            let bytes = printed as i64;
            let tail = tail_of(chunks, tail_max);
            let kept = This::append_tail(conn, session_id, &tail, printed, tail_max).await?;
            let stripe: i32 = sqlx::query_scalar(STRIPE_OF)
                .bind(session_id)
                .fetch_one(&mut *conn)
                .await?;
            sqlx::query("UPDATE output_stripes SET bytes = bytes + $1 WHERE shard = $2")
                .bind(bytes)
                .bind(stripe)
                .execute(&mut *conn)
                .await?;
            // The other stripes as last committed: writes of other shards in
            // flight meanwhile count at their commit, and the next write
            // over the budget drops what they add.
            let mut total: i64 =
                sqlx::query_scalar("SELECT CAST(COALESCE(SUM(bytes), 0) AS BIGINT) FROM output_stripes")
                    .fetch_one(&mut *conn)
                    .await?;
            let events: Vec<NewEvent> = joined(chunks)
                .iter()
                .map(|(stream, data)| {
                    let detail = EventDetail::Output(Output::of(stream, data));
                    NewEvent {
                        bytes: Some(data.len() as i64),
                        ..NewEvent::new(session_id, EventKind::Output, status, &detail)
                    }
                })
                .collect();
            This::append_events(&mut *conn, &events, false).await?;
            if kept as u64 > budget.session_bytes {
                total -= drop_oldest(conn, session_id, kept - low_water(budget.session_bytes), stripe).await?;
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
                let freed = drop_oldest(conn, &largest, need, stripe).await?;
                if freed == 0 {
                    break;
                }
                total -= freed;
            }
            Ok(())
        }
    }

    /// Drops a session's oldest output events, at least `need` bytes of them
    /// (all it keeps, if fewer), and moves its `output_truncated` event to the
    /// newest one dropped; takes the bytes off the writer's `stripe` (the
    /// total is the stripes' sum). Returns the bytes dropped.
    async fn drop_oldest(
        conn: &mut Conn,
        session_id: &str,
        need: i64,
        stripe: i32,
    ) -> Result<i64, SessionError> {
        // The oldest events whose running sum first reaches `need`.
        let (freed, count, last): (Option<i64>, i64, Option<i64>) = sqlx::query_as(
            "WITH o AS (SELECT id, COALESCE(bytes, 0) AS b, \
                 SUM(COALESCE(bytes, 0)) OVER (ORDER BY id) AS run FROM events \
               WHERE session_id = $1 AND kind = 'output'), \
             upto AS (SELECT COALESCE(MIN(id) FILTER (WHERE run >= $2), MAX(id)) AS id FROM o) \
             SELECT CAST(SUM(b) AS BIGINT), COUNT(*), MAX(id) FROM o WHERE id <= (SELECT id FROM upto)",
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
        sqlx::query("UPDATE output_stripes SET bytes = bytes - $1 WHERE shard = $2")
            .bind(freed)
            .bind(stripe)
            .execute(&mut *conn)
            .await?;
        Ok(freed)
    }
}
