//! The `Store` contract of a session's end reaching its children (their
//! parent-end policies), on both backends alike, for every way a session
//! ends: its process's exit, a failure, a lost runner, a termination, a
//! finish; and wall-clock budgets, which still hold for orphans.
//!
//! The tree below `r` (root, active throughout):
//!
//! ```text
//! p ── t (terminate) ── tt (terminate) ── ttn (notify)
//!   │                └─ ta (abandon)
//!   ├─ a (abandon) ──── at (terminate)
//!   └─ n (notify) ───── nt (terminate)
//! ```
//!
//! When `p` ends: `t` and `tt` are terminated (`cascade`); `ta` and `ttn`
//! are orphaned (their parents were terminated), `ttn` told so; `a` and `n`
//! are orphaned, `n` told how `p` ended; `at` and `nt` keep running, not
//! orphans (their parents live on).
//!
//! PostgreSQL too: `TROUPE_TEST_POSTGRES_URL` (`source scripts/pg-env`).

use troupe_proto::{agent::stdin::ParentEnded, session::SessionStatus};
use troupe_session_svc::{
    error::{QuotaLeft, SessionError},
    model::{
        Action, AuditRecord, Budget, Charge, Cost, EventFilter, EventKind, ExitReason, Failure,
        Finish, NewSession, Outcome, ParentEnd, Principal, ProcessChange, ProcessExit, Trust,
        now_ms,
    },
    policy::{self, Admission, SpawnContext},
    store::{EventPage, Fence, Holder, Store},
};

fn new_session(id: &str, on_parent_end: ParentEnd, budget: Budget) -> NewSession {
    NewSession {
        on_parent_end,
        budget,
        ..troupe_tests::stores::new_session(id, Trust::Sandboxed)
    }
}

fn audit(action: Action, target: &str) -> AuditRecord {
    troupe_tests::stores::operator_audit(action, target)
}

fn admit(ctx: &SpawnContext<'_>) -> Result<Admission, SessionError> {
    Ok(Admission {
        depth: ctx.parent.depth + 1,
        parent_spawn_tat_ms: ctx.parent.spawn_tat_ms,
        quota: QuotaLeft::default(),
        deadline_ms: policy::deadline(ctx.budget, ctx.accounts, ctx.now_ms),
    })
}

/// Makes `children` (`(parent, id, policy)`, in order) under a root `r`,
/// each started, those named in `budgeted` with a minute's wall-clock
/// budget and one model call; returns the lease's fence.
async fn tree<S: Store>(
    store: &S,
    children: &[(&str, &str, ParentEnd)],
    budgeted: &[&str],
) -> Fence {
    let fence = store
        .acquire_lease(&Holder::generate(), std::time::Duration::from_secs(3600))
        .await
        .expect("lease")
        .expect("lease free");
    troupe_tests::embedded_runner(store, &fence).await;
    store
        .create_root(
            new_session("r", ParentEnd::Terminate, Budget::default()),
            None,
            audit(Action::CreateSession, "r"),
            &|_| Ok(QuotaLeft::default()),
        )
        .await
        .expect("root");
    for (parent, id, policy) in children {
        let budget = Budget {
            wall_ms: budgeted.contains(id).then_some(60_000),
            calls: budgeted.contains(id).then_some(1),
            ..Default::default()
        };
        store
            .create_child(
                parent,
                new_session(id, *policy, budget),
                None,
                audit(Action::CreateSession, id),
                &admit,
            )
            .await
            .expect("child");
        store.start_process(&fence, id).await.expect("process");
        store
            .record_process(&fence, id, 1, ProcessChange::Started, 1024)
            .await
            .expect("started");
    }
    fence
}

const MIXED: [(&str, &str, ParentEnd); 10] = [
    ("r", "p", ParentEnd::Terminate),
    ("p", "t", ParentEnd::Terminate),
    ("p", "a", ParentEnd::Abandon),
    ("p", "n", ParentEnd::Notify),
    ("t", "tt", ParentEnd::Terminate),
    ("t", "ta", ParentEnd::Abandon),
    ("a", "at", ParentEnd::Terminate),
    ("n", "nt", ParentEnd::Terminate),
    ("tt", "ttn", ParentEnd::Notify),
    ("r", "sibling", ParentEnd::Terminate),
];

async fn events_of<S: Store>(store: &S, id: &str) -> Vec<(EventKind, serde_json::Value)> {
    let filter = EventFilter {
        session_id: Some(id.to_owned()),
        ..Default::default()
    };
    match store.events_after(&filter, 0, 1000).await.expect("events") {
        EventPage::Events(events) => events
            .into_iter()
            .map(|e| (e.kind, serde_json::from_str(&e.detail).unwrap()))
            .collect(),
        EventPage::Expired { .. } => panic!("nothing is pruned here"),
    }
}

/// The `parent_ended` notices in a session's inbox, from Troupe.
async fn notices<S: Store>(store: &S, id: &str) -> Vec<ParentEnded> {
    let inbox = store.undelivered(id).await.expect("inbox");
    inbox
        .iter()
        .map(|m| {
            assert_eq!(m.sender, Principal::Troupe, "a notice is Troupe's");
            assert!(!m.body.contains("\"p\""), "no session named: {}", m.body);
            ParentEnded::parse(&m.body).expect("a parent_ended notice")
        })
        .collect()
}

/// Asserts what `p`'s end (with `status`, `reason` as its notice says)
/// did to the [`MIXED`] tree below it.
async fn assert_applied<S: Store>(store: &S, status: SessionStatus, reason: &str) {
    let row = |id: &'static str| async move { store.get_session(id).await.unwrap().unwrap() };
    let p = row("p").await;
    assert_eq!(p.status, status);
    for id in ["t", "tt"] {
        let s = row(id).await;
        assert_eq!(
            (s.status, s.end_reason.as_deref(), s.orphaned),
            (SessionStatus::Terminated, Some("cascade"), false),
            "{id}"
        );
    }
    let (kind, detail) = events_of(store, "t").await.pop().unwrap();
    assert_eq!(kind, EventKind::Terminated);
    assert_eq!(detail["reason"], "cascade");
    assert_eq!(
        detail["parent_ended"],
        troupe_proto::status::status_str(status)
    );
    let (_, detail) = events_of(store, "tt").await.pop().unwrap();
    assert_eq!(detail["parent_ended"], "terminated");
    for (id, orphan) in [
        ("a", true),
        ("n", true),
        ("ta", true),
        ("ttn", true),
        ("at", false),
        ("nt", false),
        ("r", false),
        ("sibling", false),
    ] {
        let s = row(id).await;
        assert_eq!((s.is_active(), s.orphaned), (true, orphan), "{id}");
    }
    for (id, policy, parent_status) in [
        ("a", "abandon", troupe_proto::status::status_str(status)),
        ("ta", "abandon", "terminated"),
    ] {
        let events = events_of(store, id).await;
        let (kind, detail) = events.last().unwrap();
        assert_eq!(*kind, EventKind::Orphaned, "{id}");
        assert_eq!(detail["policy"], policy);
        assert_eq!(detail["parent_status"], parent_status);
    }
    // Notified: an orphaned event, then the message's, once.
    let kinds: Vec<EventKind> = events_of(store, "n").await[2..]
        .iter()
        .map(|(k, _)| *k)
        .collect();
    assert_eq!(kinds, vec![EventKind::Orphaned, EventKind::Message]);
    let told = notices(store, "n").await;
    assert_eq!(told.len(), 1);
    assert_eq!(told[0].status, troupe_proto::status::status_str(status));
    assert_eq!(told[0].reason, reason);
    let told = notices(store, "ttn").await;
    assert_eq!(
        (told.len(), told[0].status.as_str(), told[0].reason.as_str()),
        (1, "terminated", "cascade")
    );
    for quiet in ["a", "ta", "at", "nt", "sibling"] {
        assert!(notices(store, quiet).await.is_empty(), "{quiet}");
    }
    assert_eq!(store.get_session("n").await.unwrap().unwrap().inbox_seq, 1);
    // One audit entry of what the end did.
    let entries = store.list_audit(Some("p"), 0, 100).await.unwrap();
    let entry = entries
        .iter()
        .find(|e| e.action == "parent_ended")
        .expect("audited");
    let detail: serde_json::Value = serde_json::from_str(&entry.detail).unwrap();
    assert_eq!(detail["terminated"], serde_json::json!(["t", "tt"]));
    assert_eq!(detail["abandoned"], serde_json::json!(["a", "ta"]));
    assert_eq!(detail["notified"], serde_json::json!(["n", "ttn"]));
    // Stopping: the terminated ones, none of the orphans.
    let mut unstopped = store.driver_work().await.unwrap().unstopped;
    unstopped.retain(|id| id != "p");
    unstopped.sort();
    assert_eq!(unstopped, vec!["t".to_owned(), "tt".to_owned()]);
}

/// `p`'s process exits (code 3: failed).
async fn on_exit<S: Store>(store: S) {
    let fence = tree(&store, &MIXED, &[]).await;
    let exit = ProcessChange::Exited(ProcessExit {
        code: 3,
        reason: ExitReason::Exited,
        detail: String::new(),
    });
    store
        .record_process(&fence, "p", 2, exit, 1024)
        .await
        .expect("exit");
    assert_applied(&store, SessionStatus::Failed, "exited").await;
}

/// `p` is failed as lost, or as its runner lost.
async fn on_failure<S: Store>(store: S, failure: Failure, reason: &str) {
    let fence = tree(&store, &MIXED, &[]).await;
    let ended = store
        .fail_session(&fence, "p", failure, "gone", audit(Action::RunnerLost, "p"))
        .await
        .expect("fail");
    assert!(ended);
    assert_applied(&store, SessionStatus::Failed, reason).await;
}

/// `p` is terminated by the operator, with a text of its own.
async fn on_terminate<S: Store>(store: S) {
    tree(&store, &MIXED, &[]).await;
    let (ended, _) = store
        .terminate(
            "p",
            &Principal::Operator,
            "my private reason",
            audit(Action::TerminateSession, "p"),
            &|_, _| Ok(()),
        )
        .await
        .expect("terminate");
    assert_eq!(ended, vec!["p".to_owned(), "t".to_owned(), "tt".to_owned()]);
    assert_applied(&store, SessionStatus::Terminated, "manual").await;
    // Terminating the ended `p` again ends what is left under it, orphans
    // and all: the operator's way to clear them.
    let (ended, _) = store
        .terminate(
            "p",
            &Principal::Operator,
            "",
            audit(Action::TerminateSession, "p"),
            &|_, _| Ok(()),
        )
        .await
        .expect("terminate again");
    let mut ended = ended;
    ended.sort();
    assert_eq!(ended, ["a", "at", "n", "nt", "ta", "ttn"]);
}

/// `p` finishes its task.
async fn on_finish<S: Store>(store: S) {
    tree(&store, &MIXED, &[]).await;
    let finish = Finish {
        outcome: Outcome::Success,
        result: "done".to_owned(),
    };
    let (terminated, _) = store
        .finish(
            "p",
            &finish,
            now_ms() + 3_600_000,
            audit(Action::FinishSession, "p"),
            &policy::may_finish,
        )
        .await
        .expect("finish");
    assert_eq!(terminated, vec!["t".to_owned(), "tt".to_owned()]);
    assert_applied(&store, SessionStatus::Completed, "finished").await;
}

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
    let exit = ProcessChange::Exited(ProcessExit {
        code: 0,
        reason: ExitReason::Exited,
        detail: String::new(),
    });
    store
        .record_process(&fence, "p", 2, exit, 1024)
        .await
        .expect("exit");
    let a = store.get_session("a").await.unwrap().unwrap();
    assert!(a.is_active() && a.orphaned);
    let one_call = Charge {
        cost: Cost(0),
        tokens: 0,
        calls: 1,
    };
    let admit = |session: &_, path: &[_]| policy::admit_charge(session, path, &one_call, now_ms());
    store
        .reserve("a", one_call, &admit)
        .await
        .expect("p's one call");
    let refused = store
        .reserve("a", one_call, &admit)
        .await
        .expect_err("p's budget is spent");
    assert_eq!(refused.reason().as_str(), "BUDGET_EXCEEDED", "{refused}");
    // Not before the deadline...
    assert!(store.over_deadline(now_ms()).await.unwrap().is_empty());
    // ...after it, the orphan is due: its deadline is its parent's.
    let due = store.over_deadline(now_ms() + 61_000).await.unwrap();
    assert!(due.contains(&"a".to_owned()), "{due:?}");
    for id in &due {
        store
            .end_for_budget(&fence, id, audit(Action::EndForBudget, id))
            .await
            .expect("end for budget");
    }
    for id in ["a", "q", "qa"] {
        let s = store.get_session(id).await.unwrap().unwrap();
        assert_eq!(
            (s.status, s.end_reason.as_deref()),
            (SessionStatus::Terminated, Some("budget")),
            "{id}"
        );
    }
    let r = store.get_session("r").await.unwrap().unwrap();
    assert!(r.is_active(), "no budget of its own");
}

#[tokio::test]
async fn a_parents_end_applies_its_childrens_policies_on_sqlite() {
    let (_d, store) = troupe_tests::stores::sqlite().await;
    on_exit(store).await;
    let (_d, store) = troupe_tests::stores::sqlite().await;
    on_failure(store, Failure::Lost, "lost").await;
    let (_d, store) = troupe_tests::stores::sqlite().await;
    on_failure(store, Failure::RunnerLost, "runner_lost").await;
    let (_d, store) = troupe_tests::stores::sqlite().await;
    on_terminate(store).await;
    let (_d, store) = troupe_tests::stores::sqlite().await;
    on_finish(store).await;
}

#[tokio::test]
async fn a_parents_end_applies_its_childrens_policies_on_postgres() {
    on_exit(troupe_tests::stores::postgres().await).await;
    on_failure(
        troupe_tests::stores::postgres().await,
        Failure::Lost,
        "lost",
    )
    .await;
    on_failure(
        troupe_tests::stores::postgres().await,
        Failure::RunnerLost,
        "runner_lost",
    )
    .await;
    on_terminate(troupe_tests::stores::postgres().await).await;
    on_finish(troupe_tests::stores::postgres().await).await;
}

#[tokio::test]
async fn budgets_hold_for_orphans_on_sqlite() {
    let (_d, store) = troupe_tests::stores::sqlite().await;
    on_budget(store).await;
}

#[tokio::test]
async fn budgets_hold_for_orphans_on_postgres() {
    on_budget(troupe_tests::stores::postgres().await).await;
}
