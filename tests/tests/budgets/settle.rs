//! Settlements on every account of the path, exactly; stale reservations
//! released.

use super::*;

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
        session_id: Some("s_b".into()),
        ..EventFilter::default()
    };
    let EventPage::Events(events) = store
        .events_after(&filter, &Default::default(), 100)
        .await
        .expect("events")
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
