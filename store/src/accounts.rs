//! Accounts (a session's budget and usage) as both stores read and write
//! them: the row ([`RawAccount`], `account_columns!`), what a new session's
//! account holds, the `usage` event's detail, and how long a reservation
//! may stay unsettled.

use std::time::Duration;

use crate::{
    error::{SessionError, StorageKind},
    model::{Account, Budget, Charge, Cost, OwnUsage, TokenUsage},
};

/// How long a reservation may go unsettled before the store's upkeep
/// ([`super::UpkeepStore::maintain`]) releases it: its call's replica died
/// mid-call. Longer than any model call streams.
pub const RESERVATION_STALE_AFTER: Duration = Duration::from_secs(30 * 60);
/// Stale reservations released per round of upkeep, at most.
pub const RESERVATION_RELEASE_BATCH: u32 = 100;

/// Inserts a new session's account: its id, depth, budget's limits (as
/// [`stored_budget`] gives them) and deadline.
pub(crate) const INSERT_ACCOUNT: &str = "INSERT INTO accounts (session_id, depth, \
     cost_limit, tokens_limit, calls_limit, wall_ms, deadline_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// Binds a new account's values to [`INSERT_ACCOUNT`]'s parameters, in
/// order: on a query, or a batch.
macro_rules! bind_account {
    ($q:expr, $session_id:expr, $depth:expr, $limits:expr, $deadline_ms:expr) => {{
        let [cost, tokens, calls, wall]: [Option<i64>; 4] = $limits;
        $q.bind($session_id.to_owned())
            .bind(i64::from($depth))
            .bind(cost)
            .bind(tokens)
            .bind(calls)
            .bind(wall)
            .bind($deadline_ms)
    }};
}
pub(crate) use bind_account;

/// Expands to the account columns, in [`RawAccount`]'s field order, for `concat!`.
macro_rules! account_columns {
    () => {
        "session_id, depth, cost_limit, tokens_limit, calls_limit, wall_ms, deadline_ms, \
         own_calls, own_input, own_output, own_cache_read, own_cache_write, own_cost, \
         sub_calls, sub_tokens, sub_cost, res_calls, res_tokens, res_cost"
    };
}
pub(crate) use account_columns;

/// An `accounts` row as stored (every number a signed 64-bit integer).
#[derive(sqlx::FromRow)]
pub(crate) struct RawAccount {
    session_id: String,
    depth: i64,
    cost_limit: Option<i64>,
    tokens_limit: Option<i64>,
    calls_limit: Option<i64>,
    wall_ms: Option<i64>,
    deadline_ms: Option<i64>,
    own_calls: i64,
    own_input: i64,
    own_output: i64,
    own_cache_read: i64,
    own_cache_write: i64,
    own_cost: i64,
    sub_calls: i64,
    sub_tokens: i64,
    sub_cost: i64,
    res_calls: i64,
    res_tokens: i64,
    res_cost: i64,
}

fn count(n: i64) -> Result<u64, SessionError> {
    u64::try_from(n).map_err(|_| {
        SessionError::storage(StorageKind::Other, format!("negative stored count {n}"))
    })
}

fn limit(n: Option<i64>) -> Result<Option<u64>, SessionError> {
    n.map(count).transpose()
}

impl RawAccount {
    pub(crate) fn into_account(self) -> Result<Account, SessionError> {
        Ok(Account {
            session_id: self.session_id.into(),
            depth: u32::try_from(count(self.depth)?).unwrap_or(u32::MAX),
            budget: Budget {
                cost: limit(self.cost_limit)?.map(Cost),
                tokens: limit(self.tokens_limit)?,
                calls: limit(self.calls_limit)?,
                wall_ms: limit(self.wall_ms)?,
            },
            deadline_ms: self.deadline_ms,
            own: OwnUsage {
                calls: count(self.own_calls)?,
                tokens: TokenUsage {
                    input: count(self.own_input)?,
                    output: count(self.own_output)?,
                    cache_read: count(self.own_cache_read)?,
                    cache_write: count(self.own_cache_write)?,
                },
                cost: Cost(count(self.own_cost)?),
            },
            subtree: Charge {
                cost: Cost(count(self.sub_cost)?),
                tokens: count(self.sub_tokens)?,
                calls: count(self.sub_calls)?,
            },
            reserved: Charge {
                cost: Cost(count(self.res_cost)?),
                tokens: count(self.res_tokens)?,
                calls: count(self.res_calls)?,
            },
        })
    }
}

/// Reads a path's rows (any order) as accounts, root first.
pub(crate) fn path_of(raw: Vec<RawAccount>) -> Result<Vec<Account>, SessionError> {
    let mut path = raw
        .into_iter()
        .map(RawAccount::into_account)
        .collect::<Result<Vec<_>, _>>()?;
    path.sort_by_key(|a| a.depth);
    Ok(path)
}

/// A count as a stored integer: one past `i64::MAX` is refused (no budget or
/// call comes near it).
pub(crate) fn stored(n: u64) -> Result<i64, SessionError> {
    i64::try_from(n).map_err(|_| SessionError::invalid("budget", "too large"))
}

/// A budget's limits as stored, in column order (cost, tokens, calls, wall).
pub(crate) fn stored_budget(budget: &Budget) -> Result<[Option<i64>; 4], SessionError> {
    Ok([
        budget.cost.map(|c| stored(c.0)).transpose()?,
        budget.tokens.map(stored).transpose()?,
        budget.calls.map(stored).transpose()?,
        budget.wall_ms.map(stored).transpose()?,
    ])
}

/// Releases reservations left stale (a failure is logged: the upkeep
/// goes on), a batch per call: the part of [`crate::UpkeepStore::maintain`]
/// both backends do alike.
pub(crate) async fn release_stale(store: &impl crate::BudgetStore) {
    let stale_before =
        crate::model::now_ms().saturating_sub(RESERVATION_STALE_AFTER.as_millis() as i64);
    match store
        .release_stale_reservations(stale_before, RESERVATION_RELEASE_BATCH)
        .await
    {
        Ok(0) => {}
        Ok(n) => tracing::warn!(released = n, "stale model-call reservations released"),
        Err(e) => tracing::warn!(error = %e, "releasing stale reservations failed"),
    }
}
