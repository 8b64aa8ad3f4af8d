use super::*;
use crate::model::TokenUsage;

fn account(id: &str, depth: u32, budget: Budget) -> Account {
    Account {
        session_id: id.into(),
        depth,
        budget,
        ..Account::default()
    }
}

fn tokens(n: u64) -> Charge {
    Charge::of_call(
        &TokenUsage {
            input: n,
            ..TokenUsage::default()
        },
        Cost::ZERO,
    )
}

#[test]
fn a_charge_fits_exactly_at_the_limit_and_not_one_past() {
    let mut root = account(
        "root",
        0,
        Budget {
            tokens: Some(100),
            ..Budget::default()
        },
    );
    root.subtree.tokens = 60;
    root.reserved.tokens = 30;
    let path = [root, account("child", 1, Budget::default())];
    assert!(admit_charge_on(&path, &tokens(10)).is_ok());
    let err = admit_charge_on(&path, &tokens(11)).unwrap_err();
    let SessionError::BudgetExceeded { refusal, .. } = err else {
        panic!("{err:?}")
    };
    assert_eq!(refusal.session_id, "root");
    assert_eq!(refusal.dimension, Dimension::Tokens);
    assert_eq!((refusal.limit, refusal.used), (100, 90));
    assert_eq!(refusal.left.tokens, Some(10));
}

fn admit_charge_on(path: &[Account], worst: &Charge) -> Result<(), SessionError> {
    let row = crate::model::SessionRow {
        session_id: path.last().unwrap().session_id.clone(),
        workspace_id: "ws".into(),
        parent_session_id: None,
        parent_trust: None,
        tree_id: "t".into(),
        depth: 0,
        trust: crate::model::Trust::Sandboxed,
        agent_name: "a".into(),
        agent_command: "[]".into(),
        title: String::new(),
        status: troupe_proto::session::SessionStatus::Running,
        created_by: crate::model::Principal::Operator,
        created_at_ms: 0,
        ended_at_ms: None,
        end_reason: None,
        spawn_tat_ms: 0,
        inbox_seq: 0,
        trace: None,
        write_scope: Default::default(),
        on_parent_end: Default::default(),
        orphaned: false,
    };
    admit_charge(&row, path, worst, 1_000)
}

#[test]
fn a_child_may_only_narrow() {
    let mut root = account(
        "root",
        0,
        Budget {
            cost: Some(Cost(1_000)),
            ..Budget::default()
        },
    );
    root.subtree.cost = Cost(400);
    let path = [root];
    let ask = |n| Budget {
        cost: Some(Cost(n)),
        ..Budget::default()
    };
    assert_eq!(admit_budget(&ask(600), &path, 0).unwrap(), None);
    assert!(matches!(
        admit_budget(&ask(601), &path, 0),
        Err(SessionError::BudgetExceeded { .. })
    ));
}

#[test]
fn a_deadline_is_the_earliest_of_its_own_and_its_path() {
    let mut root = account(
        "root",
        0,
        Budget {
            wall_ms: Some(1_000),
            ..Budget::default()
        },
    );
    root.deadline_ms = Some(5_000);
    let own = |w| Budget {
        wall_ms: Some(w),
        ..Budget::default()
    };
    assert_eq!(deadline(&own(500), &[root.clone()], 4_000), Some(4_500));
    assert_eq!(deadline(&own(2_000), &[root.clone()], 4_000), Some(5_000));
    assert_eq!(
        deadline(&Budget::default(), &[root.clone()], 4_000),
        Some(5_000)
    );
    assert!(admit_budget(&Budget::default(), &[root], 5_000).is_err());
}
