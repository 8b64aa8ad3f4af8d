//! Budgets and usage on PostgreSQL: reservations, settlements, stale
//! reservations released, accounts read, and the sessions whose wall-clock
//! budget ran out.
//!
//! A reservation locks the accounts of its session's path root-down (by
//! depth) before it reads them, so reservations in one tree queue on their
//! common ancestors and none can pass a check another's commit would fail;
//! locking along paths of a tree in depth order cannot deadlock. Account
//! rows are taken before any session row (a settlement's event) and by no
//! transaction that holds one (see `locks`).

use serde_json::json;
use sqlx::{AssertSqlSafe, PgConnection};
use troupe_proto::session::SessionStatus;

use super::{
    PgStore,
    events::{self, NewEvent},
    lease, locks,
    open::{RawSession, session_columns},
};
use crate::{
    error::SessionError,
    model::{
        Account, AuditRecord, Charge, Cost, EventKind, ExitReason, ModelCall, Principal,
        Reservation, SessionRow, now_ms,
    },
    store::{
        ChargeCheck, Fence,
        accounts::{RawAccount, account_columns, path_of, stored, usage_detail},
    },
};

/// The ids of a session's path (itself and every ancestor), as a CTE `up`
/// over `$1`.
const PATH: &str = "WITH RECURSIVE up(id) AS ( \
       SELECT $1::text \
       UNION ALL \
       SELECT s.parent_session_id FROM sessions s JOIN up ON s.session_id = up.id \
       WHERE s.parent_session_id IS NOT NULL) ";

/// Reads the accounts of `session_id`'s path, root first; with `lock`,
/// locks them root-down.
pub(super) async fn path(
    conn: &mut PgConnection,
    session_id: &str,
    lock: bool,
) -> Result<Vec<Account>, SessionError> {
    let sql = format!(
        "{PATH}SELECT {} FROM accounts WHERE session_id IN (SELECT id FROM up) ORDER BY depth{}",
        account_columns!(),
        if lock {
            " FOR NO KEY UPDATE OF accounts"
        } else {
            ""
        }
    );
    let raw: Vec<RawAccount> = sqlx::query_as(AssertSqlSafe(sql))
        .bind(session_id)
        .fetch_all(conn)
        .await?;
    path_of(raw)
}

/// Adds `sign` × `charge` to the reserved counters of the accounts `ids`
/// (locked by the caller).
async fn reserve_on(
    conn: &mut PgConnection,
    ids: &[String],
    charge: &Charge,
    sign: i64,
) -> Result<(), SessionError> {
    sqlx::query(
        "UPDATE accounts SET res_calls = res_calls + $2, res_tokens = res_tokens + $3, \
         res_cost = res_cost + $4 WHERE session_id = ANY($1)",
    )
    .bind(ids)
    .bind(sign * stored(charge.calls)?)
    .bind(sign * stored(charge.tokens)?)
    .bind(sign * stored(charge.cost.0)?)
    .execute(conn)
    .await?;
    Ok(())
}

fn ids(path: &[Account]) -> Vec<String> {
    path.iter().map(|a| a.session_id.clone()).collect()
}

async fn read_account(
    conn: &mut PgConnection,
    session_id: &str,
) -> Result<Option<Account>, SessionError> {
    let raw: Option<RawAccount> = sqlx::query_as(concat!(
        "SELECT ",
        account_columns!(),
        " FROM accounts WHERE session_id = $1"
    ))
    .bind(session_id)
    .fetch_optional(conn)
    .await?;
    raw.map(RawAccount::into_account).transpose()
}

/// A session's row, unlocked.
async fn session_row(
    conn: &mut PgConnection,
    session_id: &str,
) -> Result<SessionRow, SessionError> {
    let raw: RawSession = sqlx::query_as(concat!(
        "SELECT ",
        session_columns!(),
        " FROM sessions WHERE session_id = $1"
    ))
    .bind(session_id)
    .fetch_optional(conn)
    .await?
    .ok_or_else(|| SessionError::not_found(session_id))?;
    raw.into_row()
}

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

impl PgStore {
    pub(super) async fn reserve_once(
        &self,
        session_id: &str,
        worst: &Charge,
        check: ChargeCheck<'_>,
    ) -> Result<Reservation, SessionError> {
        let mut tx = self.begin().await?;
        let session = session_row(&mut tx, session_id).await?;
        let accounts = path(&mut tx, session_id, true).await?;
        check(&session, &accounts)?;
        reserve_on(&mut tx, &ids(&accounts), worst, 1).await?;
        let id = format!("res_{}", uuid::Uuid::now_v7().simple());
        sqlx::query(
            "INSERT INTO reservations (reservation_id, session_id, calls, tokens, cost, created_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&id)
        .bind(session_id)
        .bind(stored(worst.calls)?)
        .bind(stored(worst.tokens)?)
        .bind(stored(worst.cost.0)?)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Reservation {
            id,
            session_id: session_id.to_owned(),
            charge: *worst,
        })
    }

    pub(super) async fn settle_once(
        &self,
        reservation: &Reservation,
        call: &ModelCall,
    ) -> Result<Account, SessionError> {
        let session_id = reservation.session_id.as_str();
        let mut tx = self.begin().await?;
        let held: Option<(i64, i64, i64)> = sqlx::query_as(
            "DELETE FROM reservations WHERE reservation_id = $1 AND session_id = $2 \
             RETURNING calls, tokens, cost",
        )
        .bind(&reservation.id)
        .bind(session_id)
        .fetch_optional(&mut *tx)
        .await?;
        let (res_calls, res_tokens, res_cost) = held.unwrap_or_default();
        let accounts = path(&mut tx, session_id, true).await?;
        let tokens = &call.tokens;
        sqlx::query(
            "UPDATE accounts SET sub_calls = sub_calls + 1, sub_tokens = sub_tokens + $2, \
             sub_cost = sub_cost + $3, res_calls = res_calls - $4, res_tokens = res_tokens - $5, \
             res_cost = res_cost - $6 WHERE session_id = ANY($1)",
        )
        .bind(ids(&accounts))
        .bind(stored(tokens.total())?)
        .bind(stored(call.cost.0)?)
        .bind(res_calls)
        .bind(res_tokens)
        .bind(res_cost)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE accounts SET own_calls = own_calls + 1, own_input = own_input + $2, \
             own_output = own_output + $3, own_cache_read = own_cache_read + $4, \
             own_cache_write = own_cache_write + $5, own_cost = own_cost + $6 \
             WHERE session_id = $1",
        )
        .bind(session_id)
        .bind(stored(tokens.input)?)
        .bind(stored(tokens.output)?)
        .bind(stored(tokens.cache_read)?)
        .bind(stored(tokens.cache_write)?)
        .bind(stored(call.cost.0)?)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO model_calls (session_id, tree_id, workspace_id, provider, model, \
               input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost, \
               started_at_ms, duration_ms, outcome, http_status) \
             SELECT session_id, tree_id, workspace_id, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12 \
             FROM sessions WHERE session_id = $1",
        )
        .bind(session_id)
        .bind(&call.provider)
        .bind(&call.model)
        .bind(stored(tokens.input)?)
        .bind(stored(tokens.output)?)
        .bind(stored(tokens.cache_read)?)
        .bind(stored(tokens.cache_write)?)
        .bind(stored(call.cost.0)?)
        .bind(call.started_at_ms)
        .bind(stored(call.duration_ms)?)
        .bind(call.outcome.as_str())
        .bind(call.http_status.map(i64::from))
        .execute(&mut *tx)
        .await?;
        let status: String =
            sqlx::query_scalar("SELECT status FROM sessions WHERE session_id = $1")
                .bind(session_id)
                .fetch_optional(&mut *tx)
                .await?
                .ok_or_else(|| SessionError::not_found(session_id))?;
        let status =
            crate::store::parse_stored("status", &status, troupe_proto::status::parse_status)?;
        let account = read_account(&mut tx, session_id)
            .await?
            .ok_or_else(|| SessionError::not_found(session_id))?;
        let event = NewEvent::new(session_id, EventKind::Usage, status, usage_detail(&account));
        events::write(&mut tx, &[event], false).await?;
        tx.commit().await?;
        self.published(false);
        Ok(account)
    }

    /// Releases one stale reservation (made before `before_ms`), if any is
    /// not being settled or released now; returns whether it did.
    pub(super) async fn release_one_stale(&self, before_ms: i64) -> Result<bool, SessionError> {
        let mut tx = self.begin().await?;
        let stale: Option<(String, String, i64, i64, i64)> = sqlx::query_as(
            "SELECT reservation_id, session_id, calls, tokens, cost FROM reservations \
             WHERE created_at_ms < $1 ORDER BY created_at_ms LIMIT 1 FOR UPDATE SKIP LOCKED",
        )
        .bind(before_ms)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((id, session_id, calls, tokens, cost)) = stale else {
            return Ok(false);
        };
        let accounts = path(&mut tx, &session_id, true).await?;
        let charge = Charge {
            cost: Cost(cost.max(0) as u64),
            tokens: tokens.max(0) as u64,
            calls: calls.max(0) as u64,
        };
        reserve_on(&mut tx, &ids(&accounts), &charge, -1).await?;
        sqlx::query("DELETE FROM reservations WHERE reservation_id = $1")
            .bind(&id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    pub(super) async fn account_impl(
        &self,
        session_id: &str,
    ) -> Result<Option<Account>, SessionError> {
        let mut conn = self.pool.acquire().await?;
        read_account(&mut conn, session_id).await
    }

    pub(super) async fn over_deadline_impl(
        &self,
        now_ms: i64,
    ) -> Result<Vec<String>, SessionError> {
        Ok(sqlx::query_scalar(
            "SELECT a.session_id FROM accounts a JOIN sessions s ON s.session_id = a.session_id \
             WHERE a.deadline_ms IS NOT NULL AND a.deadline_ms <= $1 \
               AND s.status IN ('pending', 'running') \
             ORDER BY a.depth",
        )
        .bind(now_ms)
        .fetch_all(&self.pool)
        .await?)
    }

    pub(super) async fn end_for_budget_once(
        &self,
        fence: &Fence,
        session_id: &str,
        audit: &AuditRecord,
    ) -> Result<Vec<String>, SessionError> {
        let mut tx = self.begin().await?;
        lease::check(&mut tx, fence).await?;
        locks::place_of(&mut tx, session_id).await?;
        let (row, _) = locks::session(&mut tx, session_id).await?;
        if !row.is_active() {
            return Ok(Vec::new());
        }
        let subtree = locks::active_subtree(&mut tx, session_id).await?;
        let reason = ExitReason::Budget.as_str();
        let mut ended = locks::end_sessions(
            &mut tx,
            &subtree,
            SessionStatus::Terminated,
            session_id,
            reason,
            reason,
        )
        .await?;
        ended.sort_by_key(|r| subtree.iter().position(|id| *id == r.session_id));
        let ids: Vec<String> = ended.iter().map(|r| r.session_id.clone()).collect();
        let mut audit = audit.clone();
        audit.detail = json!({"terminated": ids}).to_string();
        PgStore::insert_audit(&mut tx, &audit).await?;
        let terminated: Vec<NewEvent> = ids
            .iter()
            .map(|id| {
                NewEvent::new(
                    id,
                    EventKind::Terminated,
                    SessionStatus::Terminated,
                    json!({"reason": reason, "terminated_by": Principal::Troupe.to_string()}),
                )
            })
            .collect();
        events::write(&mut tx, &terminated, !ids.is_empty()).await?;
        tx.commit().await?;
        self.published(!ids.is_empty());
        Ok(ids)
    }
}
