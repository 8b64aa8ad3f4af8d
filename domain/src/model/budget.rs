//! Money, tokens and budgets: [`Cost`] in pico-dollars (10^-12 USD, exact
//! integers, never floats), [`TokenUsage`] by kind, a model's [`Price`], a
//! session's [`Budget`], what a call charges ([`Charge`]) and what a
//! session's account holds ([`Account`]).

use std::fmt;

use troupe_proto::money::{DecimalError, parse_decimal, usd};

use super::SessionId;

/// An amount of money in pico-dollars (10^-12 USD). Stored as a signed
/// 64-bit integer: up to about 9.2 million USD.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cost(pub u64);

impl Cost {
    pub const ZERO: Cost = Cost(0);

    pub fn pico(self) -> u64 {
        self.0
    }

    pub fn checked_add(self, other: Cost) -> Option<Cost> {
        self.0.checked_add(other.0).map(Cost)
    }

    /// Parses decimal USD (`"2.50"`), at most 12 decimals (a pico-dollar).
    pub fn parse_usd(text: &str) -> Result<Cost, DecimalError> {
        parse_decimal(text, 12).map(Cost)
    }
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "${}", usd(self.0))
    }
}

/// Tokens of one call, by kind. The tokens a budget counts are their sum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenUsage {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

impl TokenUsage {
    /// All four kinds together (saturating: no real call comes near).
    pub fn total(&self) -> u64 {
        self.input
            .saturating_add(self.output)
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_write)
    }
}

/// A model's price, in pico-dollars per token of each kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Price {
    pub input: Cost,
    pub output: Cost,
    pub cache_read: Cost,
    pub cache_write: Cost,
}

/// Digits after the point a price in USD per million tokens may have:
/// exactly what one pico-dollar per token is (10^-6 USD per million).
pub const PRICE_DECIMALS: u32 = 6;

impl Price {
    /// Parses one price in decimal USD per million tokens (`"3"`, `"0.30"`,
    /// `"3.75"`, at most [`PRICE_DECIMALS`] decimals) into pico-dollars per
    /// token: USD/M × 10^6, exactly.
    pub fn per_million(text: &str) -> Result<Cost, DecimalError> {
        parse_decimal(text, PRICE_DECIMALS).map(Cost)
    }

    /// Returns what `tokens` cost at this price, exactly; `None` if it
    /// would not fit in a [`Cost`].
    pub fn cost(&self, tokens: &TokenUsage) -> Option<Cost> {
        let part = |n: u64, price: Cost| n.checked_mul(price.0);
        let sum = part(tokens.input, self.input)?
            .checked_add(part(tokens.output, self.output)?)?
            .checked_add(part(tokens.cache_read, self.cache_read)?)?
            .checked_add(part(tokens.cache_write, self.cache_write)?)?;
        (sum <= i64::MAX as u64).then_some(Cost(sum))
    }

    /// The most a call can charge before it is made: its request's bytes as
    /// input tokens (no token is shorter than a byte) at the dearer of the
    /// input and cache-write prices, and `max_tokens` of output; one call.
    pub fn worst_case(&self, request_bytes: u64, max_tokens: u64) -> Option<Charge> {
        let input = self.input.max(self.cache_write);
        let cost = request_bytes
            .checked_mul(input.0)?
            .checked_add(max_tokens.checked_mul(self.output.0)?)?;
        Some(Charge {
            cost: Cost(cost),
            tokens: request_bytes.checked_add(max_tokens)?,
            calls: 1,
        })
    }
}

/// What a call charges a budget, or what a session spent or reserved: its
/// cost, tokens (every kind) and model calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Charge {
    pub cost: Cost,
    pub tokens: u64,
    pub calls: u64,
}

impl Charge {
    /// The charge of one call that used `tokens` for `cost`.
    pub fn of_call(tokens: &TokenUsage, cost: Cost) -> Charge {
        Charge {
            cost,
            tokens: tokens.total(),
            calls: 1,
        }
    }
}

/// A session's budget: each dimension optional (unset: no limit of its
/// own; its ancestors' still bound it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    pub cost: Option<Cost>,
    pub tokens: Option<u64>,
    pub calls: Option<u64>,
    /// Wall-clock time from the session's creation, in milliseconds.
    pub wall_ms: Option<u64>,
}

impl Budget {
    pub fn is_empty(&self) -> bool {
        *self == Budget::default()
    }
}

/// A dimension of a budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dimension {
    Cost,
    Tokens,
    Calls,
    Wall,
}

impl Dimension {
    /// Its name in refusals' metadata and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::Cost => "cost",
            Dimension::Tokens => "tokens",
            Dimension::Calls => "model_calls",
            Dimension::Wall => "wall",
        }
    }
}

/// A session's own usage: its model calls, their tokens by kind, their cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnUsage {
    pub calls: u64,
    pub tokens: TokenUsage,
    pub cost: Cost,
}

/// What a session's account holds, as the store read it: its budget and
/// deadline, and its usage, own and of its subtree (itself and every
/// descendant), settled and reserved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Account {
    pub session_id: SessionId,
    pub depth: u32,
    pub budget: Budget,
    /// When its wall-clock budget (its own or an ancestor's) runs out, ms
    /// since the Unix epoch.
    pub deadline_ms: Option<i64>,
    pub own: OwnUsage,
    /// Settled calls of the subtree.
    pub subtree: Charge,
    /// Calls of the subtree reserved and not yet settled.
    pub reserved: Charge,
}

/// What is left of the budgets over a path of sessions: the smallest
/// remainder in each dimension (`None`: no budget there).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BudgetLeft {
    pub cost: Option<Cost>,
    pub tokens: Option<u64>,
    pub calls: Option<u64>,
    pub wall_ms: Option<u64>,
}

/// How a model call ended, as its row records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallOutcome {
    /// The provider answered and its usage was read.
    Ok,
    /// The provider failed the call (an error answer, a broken stream).
    Failed,
    /// The client went away before the answer was whole.
    Cancelled,
    /// Nothing came back: released, by the gateway or as stale.
    Released,
}

impl CallOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            CallOutcome::Ok => "ok",
            CallOutcome::Failed => "failed",
            CallOutcome::Cancelled => "cancelled",
            CallOutcome::Released => "released",
        }
    }
}

/// One model call, settled: what its row records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelCall {
    pub provider: String,
    pub model: String,
    pub tokens: TokenUsage,
    pub cost: Cost,
    pub started_at_ms: i64,
    pub duration_ms: u64,
    pub outcome: CallOutcome,
    /// The provider's HTTP status, if it answered.
    pub http_status: Option<u16>,
}

/// A reservation made before a model call (the store's `BudgetStore::reserve`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub id: String,
    pub session_id: SessionId,
    pub charge: Charge,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn price(input: &str, output: &str, read: &str, write: &str) -> Price {
        Price {
            input: Price::per_million(input).unwrap(),
            output: Price::per_million(output).unwrap(),
            cache_read: Price::per_million(read).unwrap(),
            cache_write: Price::per_million(write).unwrap(),
        }
    }

    #[test]
    fn a_call_costs_to_the_cent() {
        // 1,234 input at $3/M + 567 output at $15/M = $0.003702 + $0.008505.
        let p = price("3", "15", "0.30", "3.75");
        let tokens = TokenUsage {
            input: 1_234,
            output: 567,
            ..TokenUsage::default()
        };
        let cost = p.cost(&tokens).unwrap();
        assert_eq!(cost, Cost(12_207_000_000));
        assert_eq!(cost.to_string(), "$0.012207");
        let cached = TokenUsage {
            cache_read: 10_000,
            cache_write: 2_000,
            ..tokens
        };
        // + 10,000 × $0.30/M + 2,000 × $3.75/M = + $0.003 + $0.0075.
        assert_eq!(p.cost(&cached).unwrap(), Cost(22_707_000_000));
        assert_eq!(cached.total(), 13_801);
    }

    #[test]
    fn prices_are_pico_dollars_per_token() {
        assert_eq!(Price::per_million("3"), Ok(Cost(3_000_000)));
        assert_eq!(Price::per_million("0.30"), Ok(Cost(300_000)));
        assert_eq!(Price::per_million("3.75"), Ok(Cost(3_750_000)));
        assert_eq!(Price::per_million("0.000001"), Ok(Cost(1)));
        assert_eq!(Price::per_million("-3"), Err(DecimalError::Negative));
        assert_eq!(
            Price::per_million("0.0000001"),
            Err(DecimalError::TooManyDecimals { max: 6 })
        );
        assert_eq!(Price::per_million("three"), Err(DecimalError::Malformed));
    }

    #[test]
    fn a_cost_that_does_not_fit_is_none() {
        let p = price("1000000", "1000000", "0", "0");
        let huge = TokenUsage {
            input: u64::MAX / 2,
            ..TokenUsage::default()
        };
        assert_eq!(p.cost(&huge), None);
        // Past i64::MAX but within u64: refused too (the store's column).
        let p = Price {
            input: Cost(1),
            ..Price::default()
        };
        let past = TokenUsage {
            input: i64::MAX as u64 + 1,
            ..TokenUsage::default()
        };
        assert_eq!(p.cost(&past), None);
    }

    #[test]
    fn the_worst_case_takes_the_dearer_input_price() {
        let p = price("3", "15", "0.30", "3.75");
        let worst = p.worst_case(1_000, 500).unwrap();
        assert_eq!(
            worst,
            Charge {
                cost: Cost(1_000 * 3_750_000 + 500 * 15_000_000),
                tokens: 1_500,
                calls: 1,
            }
        );
    }

    #[test]
    fn budgets_in_usd_parse_exactly() {
        assert_eq!(Cost::parse_usd("2.50"), Ok(Cost(2_500_000_000_000)));
        assert_eq!(Cost::parse_usd("0.000000000001"), Ok(Cost(1)));
        assert!(Cost::parse_usd("-1").is_err());
    }
}
