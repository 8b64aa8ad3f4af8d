//! The budget rules, over the accounts of a session's path (root first, as
//! the store read them inside its transaction): a model call's reservation
//! ([`admit_charge`]), a child's budget at its creation ([`admit_budget`]:
//! nothing spent above it, narrowing only) and a new session's deadline.

use crate::{
    error::{BudgetRefusal, SessionError},
    model::{Account, Budget, BudgetLeft, Charge, Cost, Dimension, SessionRow},
};

/// One dimension of an account with a limit: the limit, and what is used
/// (settled and reserved).
struct Bound {
    dimension: Dimension,
    limit: u64,
    used: u64,
}

/// The limited dimensions of an account (the wall clock apart).
fn bounds(account: &Account) -> impl Iterator<Item = Bound> + '_ {
    let b = &account.budget;
    let (s, r) = (&account.subtree, &account.reserved);
    [
        b.cost.map(|l| Bound {
            dimension: Dimension::Cost,
            limit: l.0,
            used: s.cost.0.saturating_add(r.cost.0),
        }),
        b.tokens.map(|l| Bound {
            dimension: Dimension::Tokens,
            limit: l,
            used: s.tokens.saturating_add(r.tokens),
        }),
        b.calls.map(|l| Bound {
            dimension: Dimension::Calls,
            limit: l,
            used: s.calls.saturating_add(r.calls),
        }),
    ]
    .into_iter()
    .flatten()
}

/// What a charge asks in a dimension.
fn asked(charge: &Charge, dimension: Dimension) -> u64 {
    match dimension {
        Dimension::Cost => charge.cost.0,
        Dimension::Tokens => charge.tokens,
        Dimension::Calls => charge.calls,
        Dimension::Wall => 0,
    }
}

/// A number of a dimension as people read it (cost in USD).
fn amount(dimension: Dimension, n: u64) -> String {
    match dimension {
        Dimension::Cost => Cost(n).to_string(),
        Dimension::Wall => format!("{n} ms"),
        Dimension::Tokens | Dimension::Calls => n.to_string(),
    }
}

/// Returns what is left of the budgets over `path`: the smallest remainder
/// in each dimension (settled and reserved both count as used), and the
/// time to the earliest deadline.
pub fn left(path: &[Account], now_ms: i64) -> BudgetLeft {
    let mut left = BudgetLeft::default();
    let min = |slot: &mut Option<u64>, n: u64| *slot = Some(slot.map_or(n, |m| m.min(n)));
    for account in path {
        for bound in bounds(account) {
            let n = bound.limit.saturating_sub(bound.used);
            match bound.dimension {
                Dimension::Cost => {
                    let mut c = left.cost.map(|c| c.0);
                    min(&mut c, n);
                    left.cost = c.map(Cost);
                }
                Dimension::Tokens => min(&mut left.tokens, n),
                Dimension::Calls => min(&mut left.calls, n),
                Dimension::Wall => {}
            }
        }
        if let Some(deadline) = account.deadline_ms {
            min(
                &mut left.wall_ms,
                deadline.saturating_sub(now_ms).max(0) as u64,
            );
        }
    }
    left
}

fn refusal(
    path: &[Account],
    now_ms: i64,
    account: &Account,
    bound: &Bound,
    message: String,
) -> SessionError {
    SessionError::BudgetExceeded {
        message,
        refusal: Box::new(BudgetRefusal {
            session_id: account.session_id.clone(),
            dimension: bound.dimension,
            limit: bound.limit,
            used: bound.used,
            left: left(path, now_ms),
        }),
    }
}

/// The first account of `path` whose wall-clock budget has run out.
fn out_of_time(path: &[Account], now_ms: i64) -> Option<(&Account, Bound)> {
    path.iter().find_map(|a| {
        let (wall, deadline) = (a.budget.wall_ms?, a.deadline_ms?);
        (deadline <= now_ms).then(|| {
            let late = now_ms.saturating_sub(deadline).max(0) as u64;
            (
                a,
                Bound {
                    dimension: Dimension::Wall,
                    limit: wall,
                    used: wall.saturating_add(late),
                },
            )
        })
    })
}

fn wall_refusal(path: &[Account], now_ms: i64, account: &Account, bound: &Bound) -> SessionError {
    refusal(
        path,
        now_ms,
        account,
        bound,
        format!(
            "budget exceeded: the wall-clock budget of session {} ({}) has run out",
            account.session_id,
            amount(Dimension::Wall, bound.limit)
        ),
    )
}

/// Admits a model call's reservation of `worst` by `session`, whose path
/// (root first, the session last) is `path`: the session is active, and
/// for every account of the path and every dimension it limits, settled +
/// reserved + `worst` stays within the limit; no wall-clock budget on the
/// path has run out. A refusal names the session whose budget, the
/// dimension, its limit and what is used.
pub fn admit_charge(
    session: &SessionRow,
    path: &[Account],
    worst: &Charge,
    now_ms: i64,
) -> Result<(), SessionError> {
    if !session.is_active() {
        return Err(SessionError::refused(
            crate::error::Reason::SessionEnded,
            format!("session {} has ended", session.session_id),
        ));
    }
    if let Some((account, bound)) = out_of_time(path, now_ms) {
        return Err(wall_refusal(path, now_ms, account, &bound));
    }
    for account in path {
        for bound in bounds(account) {
            let want = asked(worst, bound.dimension);
            if bound.used.saturating_add(want) > bound.limit {
                let message = format!(
                    "budget exceeded: session {}'s {} budget is {}, {} is used or reserved, and this call may need {}",
                    account.session_id,
                    bound.dimension.as_str(),
                    amount(bound.dimension, bound.limit),
                    amount(bound.dimension, bound.used),
                    amount(bound.dimension, want),
                );
                return Err(refusal(path, now_ms, account, &bound, message));
            }
        }
    }
    Ok(())
}

/// Admits a child's creation under the budgets of its parent's path
/// (`path`, root first, the parent last), and its `requested` budget:
/// refused when a dimension of an account on the path is spent or its
/// wall-clock budget has run out, and when the child asks more cost, tokens
/// or calls than is left (narrowing only). A wall-clock budget is narrowed
/// by its deadline instead: the child's is its own from `now_ms`, or the
/// path's earliest, whichever comes first (returned), so a longer one asks
/// nothing more.
pub fn admit_budget(
    requested: &Budget,
    path: &[Account],
    now_ms: i64,
) -> Result<Option<i64>, SessionError> {
    if let Some((account, bound)) = out_of_time(path, now_ms) {
        return Err(wall_refusal(path, now_ms, account, &bound));
    }
    for account in path {
        for bound in bounds(account) {
            if bound.used >= bound.limit {
                let message = format!(
                    "budget exceeded: session {}'s {} budget of {} is spent",
                    account.session_id,
                    bound.dimension.as_str(),
                    amount(bound.dimension, bound.limit),
                );
                return Err(refusal(path, now_ms, account, &bound, message));
            }
        }
    }
    let remaining = left(path, now_ms);
    let asks = [
        (
            Dimension::Cost,
            requested.cost.map(|c| c.0),
            remaining.cost.map(|c| c.0),
        ),
        (Dimension::Tokens, requested.tokens, remaining.tokens),
        (Dimension::Calls, requested.calls, remaining.calls),
    ];
    for (dimension, ask, have) in asks {
        if let (Some(ask), Some(have)) = (ask, have)
            && ask > have
            && let Some((account, bound)) = narrowest(path, dimension)
        {
            let message = format!(
                "budget exceeded: a child's budget may only narrow: it asks {} of {}, and session {} has {} left of its {}",
                amount(dimension, ask),
                dimension.as_str(),
                account.session_id,
                amount(dimension, have),
                amount(dimension, bound.limit),
            );
            return Err(refusal(path, now_ms, account, &bound, message));
        }
    }
    Ok(deadline(requested, path, now_ms))
}

/// The account of `path` with the least left in `dimension`, and its bound
/// there (the first, root-most, of equals).
fn narrowest(path: &[Account], dimension: Dimension) -> Option<(&Account, Bound)> {
    path.iter()
        .filter_map(|a| {
            let bound = bounds(a).find(|b| b.dimension == dimension)?;
            Some((bound.limit.saturating_sub(bound.used), a, bound))
        })
        .min_by_key(|(left, _, _)| *left)
        .map(|(_, a, bound)| (a, bound))
}

/// A new session's deadline: its own wall-clock budget from `now_ms`, or
/// its path's earliest deadline, whichever comes first.
pub fn deadline(budget: &Budget, path: &[Account], now_ms: i64) -> Option<i64> {
    let own = budget
        .wall_ms
        .map(|w| now_ms.saturating_add(i64::try_from(w).unwrap_or(i64::MAX)));
    path.iter().filter_map(|a| a.deadline_ms).chain(own).min()
}

#[cfg(test)]
mod tests;
