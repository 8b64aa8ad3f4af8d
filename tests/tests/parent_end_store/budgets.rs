//! Wall-clock and call budgets still hold for orphans, on both backends.

use super::*;

/// Budgets hold for orphans: `p` (with a budget) exits; its abandoned
/// child's model calls still count against `p`'s budget, and it lives on
/// until `p`'s deadline, then ends (`budget`); a subtree whose deadline
/// passes ends whole, `abandon` children too.
async fn on_budget<S: Store>(store: S) {
    let fence = tree(
        &store,
        &[
            ("r", "p", ParentEnd::Terminate),
            ("p", "a", ParentEnd::Abandon),
            ("r", "q", ParentEnd::Terminate),
            ("q", "qa", ParentEnd::Abandon),
        ],
        &["p", "q"],
    )
    .await;
    exits(&store, &fence, "p", 0).await;
    let a = store.get_session(&"a".into()).await.unwrap().unwrap();
    assert!(a.is_active() && a.orphaned);
    let one_call = Charge {
        cost: Cost(0),
        tokens: 0,
        calls: 1,
    };
    let admit = |session: &_, path: &[_]| policy::admit_charge(session, path, &one_call, now_ms());
    store
        .reserve(&"a".into(), one_call, &admit)
        .await
        .expect("p's one call");
    let refused = store
        .reserve(&"a".into(), one_call, &admit)
        .await
        .expect_err("p's budget is spent");
    assert_eq!(refused.reason().as_str(), "BUDGET_EXCEEDED", "{refused}");
    // Not before the deadline...
    assert!(
        store
            .over_deadline(now_ms(), ShardSet::ALL)
            .await
            .unwrap()
            .is_empty()
    );
    // ...after it, the orphan is due: its deadline is its parent's.
    let due: Vec<SessionId> = (store.over_deadline(now_ms() + 61_000, ShardSet::ALL).await)
        .unwrap()
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    assert!(due.contains(&"a".to_owned().as_str().into()), "{due:?}");
    for id in &due {
        store
            .end_for_budget(&fence, id, audit(Action::EndForBudget, id))
            .await
            .expect("end for budget");
    }
    for id in ["a", "q", "qa"] {
        let s = store.get_session(&id.into()).await.unwrap().unwrap();
        assert_eq!(
            (s.status, s.end_reason),
            (
                SessionStatus::Terminated,
                Some(EndReason::Exit(ExitReason::Budget))
            ),
            "{id}"
        );
    }
    let r = store.get_session(&"r".into()).await.unwrap().unwrap();
    assert!(r.is_active(), "no budget of its own");
}

#[tokio::test]
async fn budgets_hold_for_orphans_on_sqlite() {
    let (_d, store) = stores::sqlite().await;
    on_budget(store).await;
}

#[tokio::test]
async fn budgets_hold_for_orphans_on_postgres() {
    on_budget(stores::postgres().await).await;
}
