//! Reservations refused exactly past a limit, in each dimension; siblings'
//! concurrent reservations never pass a budget.

use super::*;

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
