//! The output tail on SQLite (the rest of output's budgets is written once,
//! in `output`), and what pruning takes off output's counters.

use sqlx::SqliteConnection;

use super::SqliteStore;
use crate::error::SessionError;

impl SqliteStore {
    /// Appends `tail`, the last bytes of `printed` new ones, to a session's
    /// output tail, which keeps its last `tail_max` bytes, and counts them
    /// kept; returns the bytes it keeps.
    /// As a blob, `substr` counts bytes and passes NULs (as text it would
    /// count characters and stop at the first NUL).
    pub(crate) async fn append_tail(
        conn: &mut SqliteConnection,
        session_id: &str,
        tail: &[u8],
        printed: usize,
        tail_max: usize,
    ) -> Result<i64, SessionError> {
        Ok(sqlx::query_scalar(
            "UPDATE processes SET output_tail = substr(CAST(output_tail || $1 AS BLOB), -$2), \
             output_bytes = output_bytes + $3 WHERE session_id = $4 RETURNING output_bytes",
        )
        .bind(tail)
        .bind(tail_max as i64)
        .bind(printed as i64)
        .bind(session_id)
        .fetch_one(conn)
        .await?)
    }
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
