//! The output tail on SQLite (the rest of output's budgets is written once,
//! in `output`).

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
