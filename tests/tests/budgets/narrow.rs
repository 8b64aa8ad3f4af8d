//! A child's budget only narrows; nothing is created under a spent one.

use super::*;

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
