//! Budgets and usage, written once for both backends (see `backends`):
//! reservations, settlements, stale reservations released, accounts read,
//! and the sessions whose wall-clock budget ran out.
//!
//! A reservation locks the accounts of its session's path root-down (by
//! depth) before it reads them (PostgreSQL; SQLite's one writer makes it
//! atomic by itself), so reservations in one tree queue on their common
//! ancestors and none can pass a check another's commit would fail;
//! locking along paths of a tree in depth order cannot deadlock. Account
//! rows are taken before any session row (a settlement's event) and by no
//! transaction that holds one. A stale reservation is released in a
//! transaction of its own, skipping one another replica is settling.

use std::future::Future;

use super::{ChargeCheck, backends::each_backend};
use crate::{
    error::SessionError,
    model::{Account, Charge, ModelCall, Reservation, SessionId},
};

/// Model calls' budgets; every [`super::Store`] is one.
pub trait BudgetStore: Send + Sync {
    /// Reserves `worst` for a model call of `session_id` if `check` admits
    /// it against the accounts of the session's path (root first), in one
    /// transaction: every account of the path counts it as reserved, and a
    /// reservation row records it with its creation time.
    fn reserve(
        &self,
        session_id: &SessionId,
        worst: Charge,
        check: ChargeCheck<'_>,
    ) -> impl Future<Output = Result<Reservation, SessionError>> + Send;

    /// Replaces `reservation` with the call's real usage, in one
    /// transaction: the call's row, its usage added to the session's own
    /// counters and to the subtree counters of every account of its path,
    /// the reservation taken off them and removed (if the upkeep released
    /// it as stale meanwhile, the usage is added all the same), and a
    /// `usage` event on the session. Returns the session's account after it.
    fn settle(
        &self,
        reservation: &Reservation,
        call: &ModelCall,
    ) -> impl Future<Output = Result<Account, SessionError>> + Send;

    /// Releases at most `limit` reservations made before `before_ms` (their
    /// call's replica died mid-call): each is taken off its path's accounts
    /// and removed, nothing billed. Returns how many. Part of
    /// [`super::UpkeepStore::maintain`] (with [`super::RESERVATION_STALE_AFTER`]).
    fn release_stale_reservations(
        &self,
        before_ms: i64,
        limit: u32,
    ) -> impl Future<Output = Result<u64, SessionError>> + Send;

    /// Returns a session's account: its budget, deadline and usage.
    fn account(
        &self,
        session_id: &SessionId,
    ) -> impl Future<Output = Result<Option<Account>, SessionError>> + Send;

    /// Returns the active sessions whose deadline (their own wall-clock
    /// budget's, or an ancestor's: an orphan's still holds after its
    /// budgeted parent ended) passed by `now_ms`, shallowest first.
    fn over_deadline(
        &self,
        now_ms: i64,
        shards: crate::shard::ShardSet,
    ) -> impl Future<Output = Result<Vec<(crate::shard::Shard, SessionId)>, SessionError>> + Send;
}

/// The ids of a session's path (itself and every ancestor), as a CTE `up`
/// over `$1`.
const PATH: &str = "WITH RECURSIVE up(id) AS ( \
       SELECT CAST($1 AS TEXT) \
       UNION ALL \
       SELECT s.parent_session_id FROM sessions s JOIN up ON s.session_id = up.id \
       WHERE s.parent_session_id IS NOT NULL) ";

each_backend! {
    use sqlx::AssertSqlSafe;

    use super::{BudgetStore, PATH};
    use crate::{
        error::SessionError,
        model::{
            Account, Charge, Cost, EventDetail, EventKind, ModelCall, Reservation, SessionId, Usage,
            now_ms,
        },
        {
            ChargeCheck,
            accounts::{RawAccount, account_columns, path_of, stored},
            journal::NewEvent,
            shared::json_ids,
        },
    };

    impl This {
        /// Reads the accounts of `session_id`'s path, root first; with
        /// `lock`, locks them root-down.
        pub(crate) async fn account_path(
            conn: &mut Conn,
            session_id: &str,
            lock: bool,
        ) -> Result<Vec<Account>, SessionError> {
            path(conn, session_id, lock).await
        }
    }

    /// Reads the accounts of `session_id`'s path, root first; with `lock`,
    /// locks them root-down.
    async fn path(
        conn: &mut Conn,
        session_id: &str,
        lock: bool,
    ) -> Result<Vec<Account>, SessionError> {
        let sql = format!(
            "{PATH}SELECT {} FROM accounts WHERE session_id IN (SELECT id FROM up) \
             ORDER BY depth{}",
            account_columns!(),
            if lock { for_update!("NO KEY UPDATE OF accounts") } else { "" }
        );
        let raw: Vec<RawAccount> = sqlx::query_as(AssertSqlSafe(sql))
            .bind(session_id)
            .fetch_all(conn)
            .await?;
        path_of(raw)
    }

    /// The accounts' ids, as `any_of!` reads them.
    fn ids(path: &[Account]) -> String {
        json_ids(path.iter().map(|a| a.session_id.as_str()))
    }

    /// Adds `sign` × `charge` to the reserved counters of the accounts of
    /// `path` (locked by the caller).
    async fn reserve_on(
        conn: &mut Conn,
        path: &[Account],
        charge: &Charge,
        sign: i64,
    ) -> Result<(), SessionError> {
        sqlx::query(concat!(
            "UPDATE accounts SET res_calls = res_calls + $2, res_tokens = res_tokens + $3, \
             res_cost = res_cost + $4 WHERE session_id ",
            any_of!(1)
        ))
        .bind(ids(path))
        .bind(sign * stored(charge.calls)?)
        .bind(sign * stored(charge.tokens)?)
        .bind(sign * stored(charge.cost.0)?)
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn read_account(
        conn: &mut Conn,
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

    impl This {

        /// Releases one stale reservation (made before `before_ms`), if any
        /// is not being settled or released now; returns whether it did.
        async fn release_one_stale(&self, before_ms: i64) -> Result<bool, SessionError> {
            let mut tx = self.tx().await?;
            let stale: Option<(String, String, i64, i64, i64)> = sqlx::query_as(concat!(
                "SELECT reservation_id, session_id, calls, tokens, cost FROM reservations \
                 WHERE created_at_ms < $1 ORDER BY created_at_ms LIMIT 1",
                for_update!("UPDATE SKIP LOCKED")
            ))
            .bind(before_ms)
            .fetch_optional(tx.conn())
            .await?;
            let Some((id, session_id, calls, tokens, cost)) = stale else {
                return Ok(false);
            };
            let accounts = path(tx.conn(), &session_id, true).await?;
            let charge = Charge {
                cost: Cost(cost.max(0) as u64),
                tokens: tokens.max(0) as u64,
                calls: calls.max(0) as u64,
            };
            reserve_on(tx.conn(), &accounts, &charge, -1).await?;
            sqlx::query("DELETE FROM reservations WHERE reservation_id = $1")
                .bind(&id)
                .execute(tx.conn())
                .await?;
            tx.commit().await?;
            Ok(true)
        }
    }

    impl BudgetStore for This {
        async fn reserve(
            &self,
            session_id: &SessionId,
            worst: Charge,
            check: ChargeCheck<'_>,
        ) -> Result<Reservation, SessionError> {
            let worst = &worst;
            retrying!(async {
                let mut tx = self.tx().await?;
                let session = self.row_of(tx.conn(), session_id).await?;
                let accounts = path(tx.conn(), session_id, true).await?;
                check(&session, &accounts)?;
                reserve_on(tx.conn(), &accounts, worst, 1).await?;
                let id = format!("res_{}", uuid::Uuid::now_v7().simple());
                sqlx::query(
                    "INSERT INTO reservations (reservation_id, session_id, calls, tokens, cost, \
                       created_at_ms) VALUES ($1, $2, $3, $4, $5, $6)",
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
                    session_id: session_id.clone(),
                    charge: *worst,
                })
            })
        }

        async fn settle(
            &self,
            reservation: &Reservation,
            call: &ModelCall,
        ) -> Result<Account, SessionError> {
            retrying!(async {
                let session_id = reservation.session_id.as_str();
                let mut tx = self.tx().await?;
                let held: Option<(i64, i64, i64)> = sqlx::query_as(
                    "DELETE FROM reservations WHERE reservation_id = $1 AND session_id = $2 \
                     RETURNING calls, tokens, cost",
                )
                .bind(&reservation.id)
                .bind(session_id)
                .fetch_optional(tx.conn())
                .await?;
                let (res_calls, res_tokens, res_cost) = held.unwrap_or_default();
                let accounts = path(tx.conn(), session_id, true).await?;
                let tokens = &call.tokens;
                sqlx::query(concat!(
                    "UPDATE accounts SET sub_calls = sub_calls + 1, sub_tokens = sub_tokens + $2, \
                     sub_cost = sub_cost + $3, res_calls = res_calls - $4, \
                     res_tokens = res_tokens - $5, res_cost = res_cost - $6 WHERE session_id ",
                    any_of!(1)
                ))
                .bind(ids(&accounts))
                .bind(stored(tokens.total())?)
                .bind(stored(call.cost.0)?)
                .bind(res_calls)
                .bind(res_tokens)
                .bind(res_cost)
                .execute(tx.conn())
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
                .execute(tx.conn())
                .await?;
                sqlx::query(
                    "INSERT INTO model_calls (session_id, tree_id, workspace_id, provider, model, \
                       input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost, \
                       started_at_ms, duration_ms, outcome, http_status) \
                     SELECT session_id, tree_id, workspace_id, $2, $3, $4, $5, $6, $7, $8, $9, $10, \
                       $11, $12 \
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
                .execute(tx.conn())
                .await?;
                let status = self.row_of(tx.conn(), session_id).await?.status;
                let account = read_account(tx.conn(), session_id)
                    .await?
                    .ok_or_else(|| SessionError::not_found(session_id))?;
                let usage = EventDetail::Usage(Usage::of(&account));
                let event = NewEvent::new(session_id, EventKind::Usage, status, &usage);
                This::append_events(tx.conn(), &[event], false).await?;
                tx.commit().await?;
                self.committed(false);
                Ok(account)
            })
        }

        async fn release_stale_reservations(
            &self,
            before_ms: i64,
            limit: u32,
        ) -> Result<u64, SessionError> {
            let mut released = 0u64;
            while released < u64::from(limit) && retrying!(self.release_one_stale(before_ms))? {
                released += 1;
            }
            Ok(released)
        }

        async fn account(&self, session_id: &SessionId) -> Result<Option<Account>, SessionError> {
            read_account(&mut *self.pool.acquire().await?, session_id).await
        }

        async fn over_deadline(
            &self,
            now_ms: i64,
            shards: crate::shard::ShardSet,
        ) -> Result<Vec<(crate::shard::Shard, SessionId)>, SessionError> {
            let rows = sqlx::query_as(
                "SELECT s.shard, a.session_id FROM accounts a JOIN sessions s \
                   ON s.session_id = a.session_id \
                 WHERE a.deadline_ms IS NOT NULL AND a.deadline_ms <= $1 \
                   AND s.status IN ('pending', 'running') \
                   AND s.shard >= 0 AND (($2 >> s.shard) & 1) = 1 \
                 ORDER BY a.depth",
            )
            .bind(now_ms)
            .bind(shards.mask())
            .fetch_all(&self.pool)
            .await?;
            Ok(crate::process::in_shards(rows))
        }
    }
}
