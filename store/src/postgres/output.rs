//! Output's stripe lock and its tail on PostgreSQL (the rest of output's
//! budgets is written once, in `output`). The total is summed from one
//! stripe per shard (`output_stripes`); every output write locks its
//! session's stripe first, so output writes (and pruning) of one shard take
//! their turns at it, and those of different shards do not meet.

use sqlx::PgConnection;

use super::PgStore;
use crate::error::SessionError;

/// Locks `session_id`'s stripe of the output total: the first lock of an
/// output write.
pub(super) async fn lock_stripe(
    conn: &mut PgConnection,
    session_id: &str,
) -> Result<(), SessionError> {
    sqlx::query(
        "SELECT bytes FROM output_stripes WHERE shard = \
           (SELECT CASE WHEN shard < 0 THEN 0 ELSE shard END FROM sessions WHERE session_id = $1) \
         FOR NO KEY UPDATE",
    )
    .bind(session_id)
    .execute(conn)
    .await?;
    Ok(())
}

impl PgStore {
    /// Appends `tail`, the last bytes of `printed` new ones, to a session's
    /// output tail, which keeps its last `tail_max` bytes (bytea counts
    /// bytes), and counts them kept; returns the bytes it keeps.
    pub(crate) async fn append_tail(
        conn: &mut PgConnection,
        session_id: &str,
        tail: &[u8],
        printed: usize,
        tail_max: usize,
    ) -> Result<i64, SessionError> {
        Ok(sqlx::query_scalar(
            "UPDATE processes SET \
               output_tail = substring(output_tail || $1 FROM \
                 GREATEST(1, length(output_tail || $1) - $2::int + 1)::int), \
               output_bytes = output_bytes + $3 WHERE session_id = $4 RETURNING output_bytes",
        )
        .bind(tail)
        .bind(tail_max.min(i32::MAX as usize) as i32)
        .bind(printed as i64)
        .bind(session_id)
        .fetch_one(conn)
        .await?)
    }
}
