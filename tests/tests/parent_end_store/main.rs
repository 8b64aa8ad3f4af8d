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
        Action, AuditRecord, Budget, Charge, Cost, EndReason, EventFilter, EventKind, ExitReason,
        Failure, Finish, NewSession, Outcome, ParentEnd, Principal, ProcessChange, ProcessExit,
        SessionId, Trust, now_ms,
    },
    policy::{self, Admission, SpawnContext},
    shard::ShardSet,
    store::{EventPage, Fence, prelude::*},
};
use troupe_tests::stores;

mod budgets;
mod endings;

fn new_session(id: &str, on_parent_end: ParentEnd, budget: Budget) -> NewSession {
    NewSession {
        on_parent_end,
        budget,
        ..stores::new_session(id, Trust::Sandboxed)
    }
}

fn audit(action: Action, target: &str) -> AuditRecord {
    stores::operator_audit(action, target)
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
    let fence = stores::fence(store).await;
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
                &SessionId::from(*parent),
                new_session(id, *policy, budget),
                None,
                audit(Action::CreateSession, id),
                &admit,
            )
            .await
            .expect("child");
        stores::started(store, &fence, id).await;
    }
    fence
}

/// `id`'s process exits with `code` (the runner's event after its start).
async fn exits<S: Store>(store: &S, fence: &Fence, id: &str, code: i32) {
    let exit = ProcessChange::Exited(ProcessExit {
        code,
        reason: ExitReason::Exited,
        detail: String::new(),
    });
    store
        .record_process(fence, &id.into(), 2, exit, 1024)
        .await
        .expect("exit");
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
        session_id: Some(id.into()),
        ..Default::default()
    };
    match store
        .events_after(&filter, &Default::default(), 1000)
        .await
        .expect("events")
    {
        EventPage::Events(events) => events
            .into_iter()
            .map(|e| (e.kind, serde_json::from_str(&e.detail).unwrap()))
            .collect(),
        EventPage::Expired { .. } => panic!("nothing is pruned here"),
    }
}

/// The `parent_ended` notices in a session's inbox, from Troupe.
async fn notices<S: Store>(store: &S, id: &str) -> Vec<ParentEnded> {
    let inbox = store.undelivered(&id.into()).await.expect("inbox");
    inbox
        .iter()
        .map(|m| {
            assert_eq!(m.sender, Principal::Troupe, "a notice is Troupe's");
            assert!(!m.body.contains("\"p\""), "no session named: {}", m.body);
            ParentEnded::parse(&m.body).expect("a parent_ended notice")
        })
        .collect()
}
