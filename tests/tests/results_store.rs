//! The `Store` contract of a session's own end (`finish`), on both
//! backends alike: the session ends as its outcome says with its result
//! stored, its active subtree is terminated (`cascade`), its parent's
//! callback is due at once, its process is stopped only after its grace,
//! and a session that has ended cannot finish.
//!
//! PostgreSQL too: `TROUPE_TEST_POSTGRES_URL` (`source scripts/pg-env`).

use troupe_proto::session::SessionStatus;
use troupe_session_svc::{
    error::QuotaLeft,
    model::{
        Action, AuditRecord, EndReason, Finish, NewSession, Outcome, Principal, Trust, now_ms,
    },
    policy,
    store::{Fence, prelude::*},
};
use troupe_tests::stores;

fn new_session(id: &str, notify_parent: bool) -> NewSession {
    NewSession {
        notify_parent,
        ..stores::new_session(id, Trust::Sandboxed)
    }
}

fn audit(action: Action, target: &str) -> AuditRecord {
    AuditRecord {
        caller: Principal::Session(target.into()),
        action,
        target: target.to_owned(),
        allowed: true,
        reason: "OK".to_owned(),
        detail: String::new(),
    }
}

/// A parent `p`, its CALLBACK child `c` (started) and `c`'s child `g`.
async fn tree<S: Store>(store: &S) -> Fence {
    let fence = stores::fence(store).await;
    store
        .create_root(
            new_session("p", false),
            None,
            audit(Action::CreateSession, "p"),
            &|_| Ok(QuotaLeft::default()),
        )
        .await
        .expect("root");
    for (parent, id) in [("p", "c"), ("c", "g")] {
        store
            .create_child(
                &parent.into(),
                new_session(id, id == "c"),
                None,
                audit(Action::CreateSession, id),
                &stores::admit_child,
            )
            .await
            .expect("child");
        stores::started(store, &fence, id).await;
    }
    fence
}

async fn contract<S: Store>(store: S) {
    tree(&store).await;
    let finish = Finish {
        outcome: Outcome::Failure,
        result: "half of it".to_owned(),
    };
    let grace_end = now_ms() + 3_600_000;
    let (terminated, row) = store
        .finish(
            &"c".into(),
            &finish,
            grace_end,
            audit(Action::FinishSession, "c"),
            &policy::may_finish,
        )
        .await
        .expect("finish");
    assert_eq!(terminated, vec!["g".to_owned()]);
    assert_eq!(row.status, SessionStatus::Failed);
    assert_eq!(row.end_reason, Some(EndReason::Finished));
    assert_eq!(
        store.finished(&"c".into()).await.unwrap(),
        Some(finish.clone())
    );
    assert_eq!(store.finished(&"p".into()).await.unwrap(), None);
    let g = store.get_session(&"g".into()).await.unwrap().unwrap();
    assert_eq!(
        (g.status, g.end_reason),
        (SessionStatus::Terminated, Some(EndReason::Cascade))
    );
    let work = stores::work(&store).await;
    assert_eq!(
        work.callbacks_due,
        vec!["c".to_owned()],
        "due at the finish"
    );
    // Its descendant is stopped at once; it has its grace.
    assert_eq!(work.unstopped, vec!["g".to_owned()]);

    let again = store
        .finish(
            &"c".into(),
            &finish,
            now_ms(),
            audit(Action::FinishSession, "c"),
            &policy::may_finish,
        )
        .await
        .unwrap_err();
    assert_eq!(again.reason().as_str(), "SESSION_ENDED", "{again}");
    // Refused, nothing changed: its grace stands.
    assert!(
        !stores::work(&store)
            .await
            .unstopped
            .contains(&"c".to_owned())
    );
}

/// Once its grace is over, a finished session's process is to be stopped.
async fn grace_over<S: Store>(store: S) {
    tree(&store).await;
    let finish = Finish {
        outcome: Outcome::Success,
        result: String::new(),
    };
    store
        .finish(
            &"c".into(),
            &finish,
            now_ms() - 1,
            audit(Action::FinishSession, "c"),
            &policy::may_finish,
        )
        .await
        .expect("finish");
    let c = store.get_session(&"c".into()).await.unwrap().unwrap();
    assert_eq!(c.status, SessionStatus::Completed);
    let mut unstopped = stores::work(&store).await.unstopped;
    unstopped.sort();
    assert_eq!(unstopped, vec!["c".to_owned(), "g".to_owned()]);
}

#[tokio::test]
async fn a_finish_ends_the_session_with_its_result_on_sqlite() {
    let (_dir, store) = stores::sqlite().await;
    contract(store).await;
    let (_dir, store) = stores::sqlite().await;
    grace_over(store).await;
}

#[tokio::test]
async fn a_finish_ends_the_session_with_its_result_on_postgres() {
    contract(stores::postgres().await).await;
    grace_over(stores::postgres().await).await;
}
