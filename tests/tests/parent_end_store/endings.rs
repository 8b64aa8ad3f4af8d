//! Every way `p` ends (its process's exit, a failure, a lost runner, a
//! termination, a finish) applies its children's policies to the [`MIXED`]
//! tree alike, on both backends.

use super::*;

/// Asserts what `p`'s end (with `status`, `reason` as its notice says)
/// did to the [`MIXED`] tree below it.
async fn assert_applied<S: Store>(store: &S, status: SessionStatus, reason: &str) {
    let row =
        |id: &'static str| async move { store.get_session(&id.into()).await.unwrap().unwrap() };
    let p = row("p").await;
    assert_eq!(p.status, status);
    for id in ["t", "tt"] {
        let s = row(id).await;
        assert_eq!(
            (s.status, s.end_reason, s.orphaned),
            (SessionStatus::Terminated, Some(EndReason::Cascade), false),
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
    assert_eq!(
        store
            .get_session(&"n".into())
            .await
            .unwrap()
            .unwrap()
            .inbox_seq,
        1
    );
    // One audit entry of what the end did.
    let entries = store.list_audit(Some(&"p".into()), 0, 100).await.unwrap();
    let entry = entries
        .iter()
        .find(|e| e.action == "parent_ended")
        .expect("audited");
    let detail: serde_json::Value = serde_json::from_str(&entry.detail).unwrap();
    assert_eq!(detail["terminated"], serde_json::json!(["t", "tt"]));
    assert_eq!(detail["abandoned"], serde_json::json!(["a", "ta"]));
    assert_eq!(detail["notified"], serde_json::json!(["n", "ttn"]));
    // Stopping: the terminated ones, none of the orphans.
    let mut unstopped = stores::work(store).await.unstopped;
    unstopped.retain(|id| id != "p");
    unstopped.sort();
    assert_eq!(unstopped, vec!["t".to_owned(), "tt".to_owned()]);
}

/// `p`'s process exits (code 3: failed).
async fn on_exit<S: Store>(store: S) {
    let fence = tree(&store, &MIXED, &[]).await;
    exits(&store, &fence, "p", 3).await;
    assert_applied(&store, SessionStatus::Failed, "exited").await;
}

/// `p` is failed as lost, or as its runner lost.
async fn on_failure<S: Store>(store: S, failure: Failure, reason: &str) {
    let fence = tree(&store, &MIXED, &[]).await;
    let ended = store
        .fail_session(
            &fence,
            &"p".into(),
            failure,
            "gone",
            audit(Action::RunnerLost, "p"),
        )
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
            &"p".into(),
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
            &"p".into(),
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
            &"p".into(),
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

#[tokio::test]
async fn a_parents_end_applies_its_childrens_policies_on_sqlite() {
    let (_d, store) = stores::sqlite().await;
    on_exit(store).await;
    let (_d, store) = stores::sqlite().await;
    on_failure(store, Failure::Lost, "lost").await;
    let (_d, store) = stores::sqlite().await;
    on_failure(store, Failure::RunnerLost, "runner_lost").await;
    let (_d, store) = stores::sqlite().await;
    on_terminate(store).await;
    let (_d, store) = stores::sqlite().await;
    on_finish(store).await;
}

#[tokio::test]
async fn a_parents_end_applies_its_childrens_policies_on_postgres() {
    on_exit(stores::postgres().await).await;
    on_failure(stores::postgres().await, Failure::Lost, "lost").await;
    on_failure(stores::postgres().await, Failure::RunnerLost, "runner_lost").await;
    on_terminate(stores::postgres().await).await;
    on_finish(stores::postgres().await).await;
}
