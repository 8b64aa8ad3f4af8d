//! Budgets and usage in the store, on the backend `TROUPE_TEST_BACKEND`
//! names (SQLite by default; `scripts/test` runs this file again on
//! PostgreSQL): a child's budget only narrows, and nothing is created under
//! a spent one; a reservation is refused exactly past the limit, in each
//! dimension, on every ancestor; concurrent reservations of siblings (and,
//! on PostgreSQL, of two stores on one database) never pass a budget; a
//! settlement lands on every account of its path exactly, with a `usage`
//! event; stale reservations are released. Through the service:
//! `budget_service.rs`.
//!
//! Until the model gateway calls them, the store's methods are called
//! directly, on the real store (`troupe_tests::stores`).

use troupe_session_svc::{
    config::Limits,
    error::SessionError,
    model::{
        Account, Action, AuditRecord, Budget, CallOutcome, Charge, Cost, Dimension, EventFilter,
        EventKind, ModelCall, NewSession, Price, Reservation, TokenUsage, Trust, now_ms,
    },
    policy,
    store::{Created, EventPage, PgStore, prelude::*},
};
use troupe_tests::{
    error_metadata,
    postgres::{Backend, fresh_database},
    reason,
    stores::sqlite,
};

/// Runs `$rule` on a fresh store of the backend the environment names.
macro_rules! on_backend {
    ($rule:ident) => {
        match Backend::from_env() {
            Backend::Sqlite => {
                let (_dir, store) = sqlite().await;
                $rule(&[store]).await;
            }
            Backend::Postgres => {
                // Two stores on one database: two replicas' pools.
                let url = fresh_database().await;
                let one = PgStore::open(&url).await.expect("postgres");
                let two = PgStore::open(&url).await.expect("postgres");
                $rule(&[one, two]).await;
            }
        }
    };
}

fn audit(target: &str) -> AuditRecord {
    troupe_tests::stores::operator_audit(Action::SendMessage, target)
}

fn new_session(id: &str, budget: Budget) -> NewSession {
    NewSession {
        budget,
        ..troupe_tests::stores::new_session(id, Trust::Direct)
    }
}

/// The service's own limits, without the spawn rate.
fn limits() -> Limits {
    Limits {
        spawn_rate_per_sec: 0.0,
        max_depth: 8,
        ..Limits::default()
    }
}

async fn root<S: Store>(store: &S, id: &str, budget: Budget) {
    let limits = limits();
    store
        .create_root(new_session(id, budget), None, audit(id), &|active| {
            policy::admit_root(active, &limits)
        })
        .await
        .expect("root");
}

/// Creates `id` under `parent` with the service's own spawn rule (budgets
/// included).
async fn spawn<S: Store>(
    store: &S,
    parent: &str,
    id: &str,
    budget: Budget,
) -> Result<Created, SessionError> {
    let limits = limits();
    store
        .create_child(
            &parent.into(),
            new_session(id, budget),
            None,
            audit(id),
            &|ctx| policy::admit_spawn(ctx, &limits),
        )
        .await
}

/// Reserves `charge` for a call of `session_id` with the service's rule.
async fn reserve<S: Store>(
    store: &S,
    session_id: &str,
    charge: Charge,
) -> Result<Reservation, SessionError> {
    store
        .reserve(&session_id.into(), charge, &|session, path| {
            policy::admit_charge(session, path, &charge, now_ms())
        })
        .await
}

async fn account<S: Store>(store: &S, id: &str) -> Account {
    store
        .account(&id.into())
        .await
        .expect("account")
        .expect("exists")
}

fn call(tokens: TokenUsage, cost: Cost) -> ModelCall {
    ModelCall {
        provider: "anthropic".to_owned(),
        model: "claude-test".to_owned(),
        tokens,
        cost,
        started_at_ms: now_ms(),
        duration_ms: 120,
        outcome: CallOutcome::Ok,
        http_status: Some(200),
    }
}

fn charge(cost: u64, tokens: u64, calls: u64) -> Charge {
    Charge {
        cost: Cost(cost),
        tokens,
        calls,
    }
}

/// Asserts a BUDGET_EXCEEDED refusal naming `session`, `dimension`, the
/// limit and what is used, with the same in its ErrorInfo.
fn assert_budget_refusal(
    result: Result<impl std::fmt::Debug, SessionError>,
    session: &str,
    dimension: Dimension,
    limit: u64,
    used: u64,
) {
    let err = result.expect_err("refused");
    let SessionError::BudgetExceeded { refusal, .. } = &err else {
        panic!("not BUDGET_EXCEEDED: {err:?}");
    };
    assert_eq!(refusal.session_id, session, "{err}");
    assert_eq!(refusal.dimension, dimension, "{err}");
    assert_eq!((refusal.limit, refusal.used), (limit, used), "{err}");
    let status = tonic::Status::from(err);
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert_eq!(reason(&status), "BUDGET_EXCEEDED");
    let meta = |key| error_metadata(&status, key);
    assert_eq!(meta("budget_session_id").as_deref(), Some(session));
    assert_eq!(
        meta("budget_dimension").as_deref(),
        Some(dimension.as_str())
    );
    assert_eq!(meta("budget_limit"), Some(limit.to_string()));
    assert_eq!(meta("budget_used"), Some(used.to_string()));
}

mod narrow;
mod reserve;
mod settle;
