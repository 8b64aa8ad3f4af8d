//! Budgets and usage on SQLite: reservations, settlements, stale
//! reservations released, accounts read, and the sessions whose wall-clock
//! budget ran out. The one writer makes each reservation atomic across the
//! session's path: nothing else writes between its check and its write.

use serde_json::json;
use sqlx::{AssertSqlSafe, SqliteConnection};
use troupe_proto::session::SessionStatus;

use super::{SqliteStore, lease, write::Write};
use crate::{
    error::SessionError,
    model::{
        Account, AuditRecord, Charge, EventKind, ExitReason, ModelCall, Principal, Reservation,
        now_ms,
    },
    store::{
        ChargeCheck,
        accounts::{RawAccount, account_columns, path_of, stored},
    },
};

/// The ids of a session's path (itself and every ancestor), as a CTE `up`
/// over the first parameter.
const PATH: &str = "WITH RECURSIVE up(id) AS ( \
       SELECT ?1 \
       UNION ALL \
       SELECT s.parent_session_id FROM sessions s JOIN up ON s.session_id = up.id \
       WHERE s.parent_session_id IS NOT NULL) ";

/// Reads the accounts of `session_id`'s path, root first.
pub(super) async fn path(
    conn: &mut SqliteConnection,
    session_id: &str,
) -> Result<Vec<Account>, SessionError> {
    let sql = format!(
        "{PATH}SELECT {} FROM accounts WHERE session_id IN (SELECT id FROM up)",
        account_columns!()
    );
    let raw: Vec<RawAccount> = sqlx::query_as(AssertSqlSafe(sql))
        .bind(session_id)
        .fetch_all(conn)
        .await?;
    path_of(raw)
}

/// Adds `sign` × `charge` to the reserved counters of `session_id`'s path.
async fn reserve_on_path(
    conn: &mut SqliteConnection,
    session_id: &str,
    charge: &Charge,
    sign: i64,
) -> Result<(), SessionError> {
    let sql = format!(
        "{PATH}UPDATE accounts SET res_calls = res_calls + ?2, res_tokens = res_tokens + ?3, \
         res_cost = res_cost + ?4 WHERE session_id IN (SELECT id FROM up)"
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(session_id)
        .bind(sign * stored(charge.calls)?)
        .bind(sign * stored(charge.tokens)?)
        .bind(sign * stored(charge.cost.0)?)
        .execute(conn)
        .await?;
    Ok(())
}

async fn read_account(
    conn: &mut SqliteConnection,
    session_id: &str,
) -> Result<Option<Account>, SessionError> {
    let raw: Option<RawAccount> = sqlx::query_as(concat!(
        "SELECT ",
        account_columns!(),
        " FROM accounts WHERE session_id = ?"
    ))
    .bind(session_id)
    .fetch_optional(conn)
    .await?;
    raw.map(RawAccount::into_account).transpose()
}

impl SqliteStore {
    pub(super) async fn reserve_impl(
        &self,
        session_id: &str,
        worst: Charge,
        check: ChargeCheck<'_>,
    ) -> Result<Reservation, SessionError> {
        let mut w = self.writer().await?;
        let session = self
            .ledger()
            .get(session_id)
            .ok_or_else(|| SessionError::not_found(session_id))?;
        let mut tx = Write::begin(&mut w.conn).await?;
        let accounts = path(tx.conn(), session_id).await?;
        check(&session, &accounts)?;
        reserve_on_path(tx.conn(), session_id, &worst, 1).await?;
        let id = format!("res_{}", uuid::Uuid::now_v7().simple());
        sqlx::query(
            "INSERT INTO reservations (reservation_id, session_id, calls, tokens, cost, created_at_ms) \
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(&id)
        .bind(session_id)
        .bind(stored(worst.calls)?)
        .bind(stored(worst.tokens)?)
        .bind(stored(worst.cost.0)?)
        .bind(now_ms())
        .execute(tx.conn())
        .await?;
        tx.commit().await?;
        Ok(Reservation {
            id,
            session_id: session_id.to_owned(),
            charge: worst,
        })
    }

    pub(super) async fn settle_impl(
        &self,
        reservation: &Reservation,
        call: &ModelCall,
    ) -> Result<Account, SessionError> {
        let session_id = reservation.session_id.as_str();
        let mut w = self.writer().await?;
        let status = self
            .ledger()
            .get(session_id)
            .ok_or_else(|| SessionError::not_found(session_id))?
            .status;
        let mut tx = Write::begin(&mut w.conn).await?;
        let held: Option<(i64, i64, i64)> = sqlx::query_as(
            "DELETE FROM reservations WHERE reservation_id = ? AND session_id = ? \
             RETURNING calls, tokens, cost",
        )
        .bind(&reservation.id)
        .bind(session_id)
        .fetch_optional(tx.conn())
        .await?;
        let (res_calls, res_tokens, res_cost) = held.unwrap_or_default();
        let tokens = &call.tokens;
        let sql = format!(
            "{PATH}UPDATE accounts SET sub_calls = sub_calls + 1, sub_tokens = sub_tokens + ?2, \
             sub_cost = sub_cost + ?3, res_calls = res_calls - ?4, res_tokens = res_tokens - ?5, \
             res_cost = res_cost - ?6 WHERE session_id IN (SELECT id FROM up)"
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(session_id)
            .bind(stored(tokens.total())?)
            .bind(stored(call.cost.0)?)
            .bind(res_calls)
            .bind(res_tokens)
            .bind(res_cost)
            .execute(tx.conn())
            .await?;
        sqlx::query(
            "UPDATE accounts SET own_calls = own_calls + 1, own_input = own_input + ?2, \
             own_output = own_output + ?3, own_cache_read = own_cache_read + ?4, \
             own_cache_write = own_cache_write + ?5, own_cost = own_cost + ?6 \
             WHERE session_id = ?1",
        )
        .bind(session_id)
        .bind(stored(tokens.input)?)
        .bind(stored(tokens.output)?)
        .bind(stored(tokens.cache_read)?)
        .bind(stored(tokens.cache_write)?)
        .bind(stored(call.cost.0)?)
        .execute(tx.conn())
        .await?;
        sqlx::query(
            "INSERT INTO model_calls (session_id, tree_id, workspace_id, provider, model, \
               input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost, \
               started_at_ms, duration_ms, outcome, http_status) \
             SELECT session_id, tree_id, workspace_id, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12 \
             FROM sessions WHERE session_id = ?1",
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
        .execute(tx.conn())
        .await?;
        let account = read_account(tx.conn(), session_id)
            .await?
            .ok_or_else(|| SessionError::not_found(session_id))?;
        tx.event(
            session_id,
            EventKind::Usage,
            status,
            crate::store::accounts::usage_detail(&account),
        )
        .await?;
        tx.commit().await?;
        drop(w);
        self.published();
        Ok(account)
    }

    pub(super) async fn release_stale_impl(
        &self,
        before_ms: i64,
        limit: u32,
    ) -> Result<u64, SessionError> {
        let mut w = self.writer().await?;
        let mut tx = Write::begin(&mut w.conn).await?;
        let stale: Vec<(String, String, i64, i64, i64)> = sqlx::query_as(
            "SELECT reservation_id, session_id, calls, tokens, cost FROM reservations \
             WHERE created_at_ms < ? ORDER BY created_at_ms LIMIT ?",
        )
        .bind(before_ms)
        .bind(i64::from(limit))
        .fetch_all(tx.conn())
        .await?;
        for (id, session_id, calls, tokens, cost) in &stale {
            let charge = Charge {
                cost: crate::model::Cost(*cost as u64),
                tokens: *tokens as u64,
                calls: *calls as u64,
            };
            reserve_on_path(tx.conn(), session_id, &charge, -1).await?;
            sqlx::query("DELETE FROM reservations WHERE reservation_id = ?")
                .bind(id)
                .execute(tx.conn())
                .await?;
        }
        tx.commit().await?;
        Ok(stale.len() as u64)
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
             WHERE a.deadline_ms IS NOT NULL AND a.deadline_ms <= ? \
               AND s.status IN ('pending', 'running') \
             ORDER BY a.depth",
        )
        .bind(now_ms)
        .fetch_all(&self.pool)
        .await?)
    }

    pub(super) async fn end_for_budget_impl(
        &self,
        fence: &crate::store::Fence,
        session_id: &str,
        audit: AuditRecord,
    ) -> Result<Vec<String>, SessionError> {
        let mut w = self.writer().await?;
        let subtree = {
            let ledger = self.ledger();
            match ledger.get(session_id) {
                Some(row) if row.is_active() => ledger.active_subtree(session_id),
                _ => return Ok(Vec::new()),
            }
        };
        w.unsettled = subtree.clone();
        let mut tx = Write::begin(&mut w.conn).await?;
        lease::check(tx.conn(), fence).await?;
        let reason = ExitReason::Budget.as_str();
        let mut ended = Vec::with_capacity(subtree.len());
        for id in &subtree {
            if let Some(entry) = tx
                .end_session(id, SessionStatus::Terminated, reason)
                .await?
            {
                tx.event(
                    id,
                    EventKind::Terminated,
                    SessionStatus::Terminated,
                    json!({"reason": reason, "terminated_by": Principal::Troupe.to_string()}),
                )
                .await?;
                ended.push(entry);
            }
        }
        let ids: Vec<String> = ended.iter().map(|(_, r)| r.session_id.clone()).collect();
        let mut audit = audit;
        audit.detail = json!({"terminated": ids}).to_string();
        tx.audit(&audit).await?;
        tx.commit().await?;
        {
            let mut ledger = self.ledger_mut();
            for (rowid, row) in ended {
                ledger.put(rowid, row);
            }
        }
        w.unsettled.clear();
        drop(w);
        self.published();
        Ok(ids)
    }
}
