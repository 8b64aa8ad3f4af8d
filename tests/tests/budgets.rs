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
        EventKind, ModelCall, NewSession, Price, Principal, Reservation, TokenUsage, Trust, now_ms,
    },
    policy,
    store::{Created, EventPage, PgStore, Store},
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
    AuditRecord {
        caller: Principal::Operator,
        action: Action::SendMessage,
        target: target.to_owned(),
        allowed: true,
        reason: "OK".to_owned(),
        detail: String::new(),
    }
}

fn new_session(id: &str, budget: Budget) -> NewSession {
    NewSession {
        session_id: id.to_owned(),
        workspace_id: "alpha".to_owned(),
        trust: Trust::Direct,
        agent_name: "worker".to_owned(),
        agent_command: "[\"/bin/cat\"]".to_owned(),
        title: id.to_owned(),
        created_by: Principal::Operator,
        trace: None,
        initial_message: None,
        notify_parent: false,
        budget,
        write_scope: Default::default(),
        on_parent_end: Default::default(),
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
        .create_child(parent, new_session(id, budget), None, audit(id), &|ctx| {
            policy::admit_spawn(ctx, &limits)
        })
        .await
}

/// Reserves `charge` for a call of `session_id` with the service's rule.
async fn reserve<S: Store>(
    store: &S,
    session_id: &str,
    charge: Charge,
) -> Result<Reservation, SessionError> {
    store
        .reserve(session_id, charge, &|session, path| {
            policy::admit_charge(session, path, &charge, now_ms())
        })
        .await
}

async fn account<S: Store>(store: &S, id: &str) -> Account {
    store.account(id).await.expect("account").expect("exists")
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

/// In each dimension, on a tree whose root limits only it: reservations by
/// a grandchild (no budget of its own) fit exactly up to the root's limit,
/// and one unit more is refused, naming the root.
async fn reserve_refuses_exactly_past_the_limit<S: Store>(stores: &[S]) {
    let store = &stores[0];
    let cases = [
        (
            Dimension::Cost,
            Budget {
                cost: Some(Cost(1_000)),
                ..Budget::default()
            },
            charge(400, 0, 0),
            charge(200, 0, 0),
            charge(1, 0, 0),
        ),
        (
            Dimension::Tokens,
            Budget {
                tokens: Some(100),
                ..Budget::default()
            },
            charge(0, 40, 0),
            charge(0, 20, 0),
            charge(0, 1, 0),
        ),
        (
            Dimension::Calls,
            Budget {
                calls: Some(5),
                ..Budget::default()
            },
            charge(0, 0, 2),
            charge(0, 0, 1),
            charge(0, 0, 1),
        ),
    ];
    for (dimension, budget, big, small, unit) in cases {
        let r = format!("r_{}", dimension.as_str());
        let (a, b) = (format!("{r}_a"), format!("{r}_b"));
        root(store, &r, budget).await;
        spawn(store, &r, &a, Budget::default()).await.expect("a");
        spawn(store, &a, &b, Budget::default()).await.expect("b");
        // 2 × big + small = the limit exactly.
        reserve(store, &b, big).await.expect("first");
        reserve(store, &b, big).await.expect("second");
        let limit = match dimension {
            Dimension::Cost => 1_000,
            Dimension::Tokens => 100,
            _ => 5,
        };
        let used_before_small = limit
            - match dimension {
                Dimension::Cost => 200,
                Dimension::Tokens => 20,
                _ => 1,
            };
        assert_budget_refusal(
            reserve(store, &b, charge_plus(small, unit)).await,
            &r,
            dimension,
            limit,
            used_before_small,
        );
        reserve(store, &b, small)
            .await
            .expect("exactly at the limit");
        assert_budget_refusal(reserve(store, &b, unit).await, &r, dimension, limit, limit);
        // The refusals reserved nothing.
        let root_account = account(store, &r).await;
        assert_eq!(
            root_account.reserved,
            charge_sum(&[big, big, small]),
            "{dimension:?}"
        );
    }
}

fn charge_plus(a: Charge, b: Charge) -> Charge {
    charge_sum(&[a, b])
}

fn charge_sum(charges: &[Charge]) -> Charge {
    charges.iter().fold(Charge::default(), |sum, c| Charge {
        cost: Cost(sum.cost.0 + c.cost.0),
        tokens: sum.tokens + c.tokens,
        calls: sum.calls + c.calls,
    })
}

#[tokio::test]
async fn reserve_refuses_exactly_past_the_limit_in_each_dimension() {
    on_backend!(reserve_refuses_exactly_past_the_limit);
}

/// A child's own budget narrows what its descendants may reserve, and the
/// child may not be given more than its parent has left; a create under a
/// spent budget is refused.
async fn a_childs_budget_only_narrows<S: Store>(stores: &[S]) {
    let store = &stores[0];
    root(
        store,
        "n",
        Budget {
            tokens: Some(1_000),
            calls: Some(10),
            ..Budget::default()
        },
    )
    .await;
    spawn(store, "n", "n_a", Budget::default())
        .await
        .expect("a");
    // 300 tokens and 2 calls settled, 100 tokens and 1 call reserved.
    for _ in 0..2 {
        let held = reserve(store, "n_a", charge(0, 150, 1))
            .await
            .expect("held");
        let used = TokenUsage {
            input: 100,
            output: 50,
            ..TokenUsage::default()
        };
        store
            .settle(&held, &call(used, Cost::ZERO))
            .await
            .expect("settle");
    }
    reserve(store, "n_a", charge(0, 100, 1))
        .await
        .expect("open");
    // 600 tokens and 7 calls are left.
    let tokens = |n| Budget {
        tokens: Some(n),
        ..Budget::default()
    };
    assert_budget_refusal(
        spawn(store, "n", "n_wide", tokens(601)).await,
        "n",
        Dimension::Tokens,
        1_000,
        400,
    );
    assert_budget_refusal(
        spawn(
            store,
            "n_a",
            "n_calls",
            Budget {
                calls: Some(8),
                ..Budget::default()
            },
        )
        .await,
        "n",
        Dimension::Calls,
        10,
        3,
    );
    spawn(store, "n_a", "n_b", tokens(600))
        .await
        .expect("exactly what is left");
    let b = account(store, "n_b").await;
    assert_eq!(b.budget.tokens, Some(600));
    // Below n_b, its own budget narrows: 600 is all its subtree may use.
    spawn(store, "n_b", "n_c", tokens(200))
        .await
        .expect("narrower");
    assert_budget_refusal(
        spawn(store, "n_c", "n_d", tokens(201)).await,
        "n_c",
        Dimension::Tokens,
        200,
        0,
    );
    // Spent: the root's calls used up (7 more), nothing more is created.
    for _ in 0..7 {
        reserve(store, "n_c", charge(0, 1, 1))
            .await
            .expect("a call");
    }
    assert_budget_refusal(
        spawn(store, "n_c", "n_e", Budget::default()).await,
        "n",
        Dimension::Calls,
        10,
        10,
    );
}

#[tokio::test]
async fn a_childs_budget_only_narrows_and_nothing_is_created_under_a_spent_one() {
    on_backend!(a_childs_budget_only_narrows);
}

/// Eight siblings under a root with a budget of 20 calls (and of cost) each
/// try 10 reservations at once, half through each store: exactly 20 pass,
/// and the root's reserved counters say so.
async fn concurrent_siblings_never_pass_the_budget<S: Store>(stores: &[S]) {
    let store = &stores[0];
    root(
        store,
        "c",
        Budget {
            calls: Some(20),
            cost: Some(Cost(20 * 7)),
            ..Budget::default()
        },
    )
    .await;
    for i in 0..8 {
        spawn(store, "c", &format!("c_{i}"), Budget::default())
            .await
            .expect("sibling");
    }
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8 {
        let id = format!("c_{i}");
        for j in 0..10 {
            let store = stores[(i + j) % stores.len()].clone();
            let id = id.clone();
            tasks.spawn(async move {
                match reserve(&store, &id, charge(7, 3, 1)).await {
                    Ok(_) => true,
                    Err(SessionError::BudgetExceeded { .. }) => false,
                    Err(e) => panic!("reservation failed: {e:?}"),
                }
            });
        }
    }
    let mut passed = 0;
    while let Some(done) = tasks.join_next().await {
        passed += usize::from(done.expect("task"));
    }
    assert_eq!(passed, 20);
    let c = account(store, "c").await;
    assert_eq!(c.reserved, charge(140, 60, 20));
    let siblings: u64 = {
        let mut sum = 0;
        for i in 0..8 {
            sum += account(store, &format!("c_{i}")).await.reserved.calls;
        }
        sum
    };
    assert_eq!(siblings, 20);
}

#[tokio::test]
async fn concurrent_reservations_of_siblings_never_pass_the_budget() {
    on_backend!(concurrent_siblings_never_pass_the_budget);
}

/// A call settled on a grandchild: its own counters (by kind), and the
/// subtree counters of it, its parent and the root, exactly; the
/// reservation taken off every one of them; a sibling untouched; a `usage`
/// event on the session with its totals.
async fn settle_lands_on_every_ancestor<S: Store>(stores: &[S]) {
    let store = &stores[0];
    root(store, "s", Budget::default()).await;
    spawn(store, "s", "s_a", Budget::default())
        .await
        .expect("a");
    spawn(store, "s_a", "s_b", Budget::default())
        .await
        .expect("b");
    spawn(store, "s", "s_x", Budget::default())
        .await
        .expect("sibling");
    let price = Price {
        input: Price::per_million("3").expect("price"),
        output: Price::per_million("15").expect("price"),
        cache_read: Price::per_million("0.30").expect("price"),
        cache_write: Price::per_million("3.75").expect("price"),
    };
    let tokens = TokenUsage {
        input: 1_234,
        output: 567,
        cache_read: 10_000,
        cache_write: 2_000,
    };
    let cost = price.cost(&tokens).expect("cost");
    assert_eq!(cost, Cost(22_707_000_000), "to the cent: $0.022707");
    let worst = price.worst_case(20_000, 1_024).expect("worst");
    let held = reserve(store, "s_b", worst).await.expect("reserve");
    for id in ["s", "s_a", "s_b"] {
        assert_eq!(account(store, id).await.reserved, worst, "{id}");
    }
    let after = store
        .settle(&held, &call(tokens, cost))
        .await
        .expect("settle");
    let settled = charge(cost.0, 13_801, 1);
    assert_eq!(after.own.tokens, tokens);
    assert_eq!((after.own.calls, after.own.cost), (1, cost));
    for id in ["s", "s_a", "s_b"] {
        let a = account(store, id).await;
        assert_eq!(a.subtree, settled, "{id}");
        assert_eq!(a.reserved, Charge::default(), "{id}");
    }
    for id in ["s", "s_a", "s_x"] {
        assert_eq!(account(store, id).await.own.calls, 0, "{id}");
    }
    assert_eq!(account(store, "s_x").await.subtree, Charge::default());
    // A second call, on the middle session: the root's subtree is the sum.
    let more = TokenUsage {
        input: 10,
        output: 5,
        ..TokenUsage::default()
    };
    let held = reserve(store, "s_a", charge(1, 1, 1))
        .await
        .expect("reserve");
    store
        .settle(&held, &call(more, price.cost(&more).expect("cost")))
        .await
        .expect("settle");
    let root_account = account(store, "s").await;
    assert_eq!(root_account.subtree.calls, 2);
    assert_eq!(root_account.subtree.tokens, 13_816);
    assert_eq!(
        root_account.subtree.cost,
        Cost(cost.0 + 10 * 3_000_000 + 5 * 15_000_000)
    );
    assert_eq!(account(store, "s_b").await.subtree, settled);
    // The usage event, as a watcher reads it.
    let filter = EventFilter {
        session_id: Some("s_b".to_owned()),
        ..EventFilter::default()
    };
    let EventPage::Events(events) = store.events_after(&filter, 0, 100).await.expect("events")
    else {
        panic!("pruned");
    };
    let usage: Vec<_> = events
        .iter()
        .filter(|e| e.kind == EventKind::Usage)
        .collect();
    assert_eq!(usage.len(), 1);
    let detail: serde_json::Value = serde_json::from_str(&usage[0].detail).expect("json");
    assert_eq!(detail["own"]["cost_pico_usd"], cost.0);
    assert_eq!(detail["own"]["cache_write_tokens"], 2_000);
    assert_eq!(detail["subtree"]["tokens"], 13_801);
}

#[tokio::test]
async fn settle_updates_own_and_subtree_counters_on_every_ancestor_exactly() {
    on_backend!(settle_lands_on_every_ancestor);
}

/// A reservation older than the bound is released (its path's reserved
/// counters back to zero, nothing billed); a fresh one is not, by the
/// store's upkeep either; a call settled after its reservation was released
/// is billed without taking it off twice.
async fn stale_ones_are_released<S: Store>(stores: &[S]) {
    let store = &stores[0];
    root(
        store,
        "z",
        Budget {
            calls: Some(3),
            ..Budget::default()
        },
    )
    .await;
    spawn(store, "z", "z_a", Budget::default())
        .await
        .expect("a");
    let held = reserve(store, "z_a", charge(5, 5, 1))
        .await
        .expect("reserve");
    let other = reserve(store, "z_a", charge(5, 5, 1))
        .await
        .expect("reserve");
    assert_eq!(
        store
            .release_stale_reservations(now_ms() - 60_000, 100)
            .await
            .expect("release"),
        0,
        "fresh reservations stay"
    );
    store.maintain().await.expect("upkeep");
    assert_eq!(account(store, "z").await.reserved.calls, 2);
    // Both made before "now + 1 s": released, at most one per limit.
    assert_eq!(
        store
            .release_stale_reservations(now_ms() + 1_000, 1)
            .await
            .expect("release"),
        1
    );
    assert_eq!(
        store
            .release_stale_reservations(now_ms() + 1_000, 100)
            .await
            .expect("release"),
        1
    );
    for id in ["z", "z_a"] {
        let a = account(store, id).await;
        assert_eq!(a.reserved, Charge::default(), "{id}");
        assert_eq!(a.subtree, Charge::default(), "{id}");
    }
    // The room is back: three calls fit again.
    let late = TokenUsage {
        input: 4,
        ..TokenUsage::default()
    };
    store
        .settle(&held, &call(late, Cost(9)))
        .await
        .expect("late settle");
    let z = account(store, "z").await;
    assert_eq!(z.reserved, Charge::default());
    assert_eq!(z.subtree, charge(9, 4, 1));
    drop(other);
    reserve(store, "z_a", charge(0, 0, 2)).await.expect("room");
    assert!(reserve(store, "z_a", charge(0, 0, 1)).await.is_err());
}

#[tokio::test]
async fn stale_reservations_are_released_and_fresh_ones_kept() {
    on_backend!(stale_ones_are_released);
}
