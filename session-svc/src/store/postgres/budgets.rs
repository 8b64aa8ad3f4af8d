//! A new session's account on PostgreSQL, inserted in its create's
//! transaction (the rest of budgets is written once, in `store::budgets`).

use sqlx::PgConnection;

use crate::error::SessionError;

/// Inserts a new session's account.
pub(super) async fn insert_account(
    conn: &mut PgConnection,
    session_id: &str,
    depth: u32,
    limits: [Option<i64>; 4],
    deadline_ms: Option<i64>,
) -> Result<(), SessionError> {
    let [cost, tokens, calls, wall] = limits;
    sqlx::query(
        "INSERT INTO accounts (session_id, depth, cost_limit, tokens_limit, calls_limit, \
         wall_ms, deadline_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(session_id)
    .bind(i64::from(depth))
    .bind(cost)
    .bind(tokens)
    .bind(calls)
    .bind(wall)
    .bind(deadline_ms)
    .execute(conn)
    .await?;
    Ok(())
}
