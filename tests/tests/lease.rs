//! The lease of the background work and its fencing, on both stores: one
//! holder at a time, taken over only once its time is out, and every write
//! a stale holder makes refused as `Fenced`, changing nothing. A callback
//! becomes due in the transaction that ends the child and is written once.

use std::time::{Duration, Instant};

use troupe_proto::session::SessionStatus;
use troupe_session_svc::{
    error::{QuotaLeft, SessionError},
    model::{
        Action, AuditRecord, ExitReason, Failure, NewMessage, NewSession, Principal, ProcessChange,
        ProcessExit, Trust,
    },
    shard::ShardSet,
    store::{Created, Fence, Holder, prelude::*},
};
use troupe_tests::stores::{self, postgres, sqlite};

const TTL: Duration = Duration::from_millis(300);

fn new_session(id: &str, notify_parent: bool) -> NewSession {
    NewSession {
        notify_parent,
        ..troupe_tests::stores::new_session(id, Trust::Direct)
    }
}

fn audit(action: Action, target: &str) -> AuditRecord {
    troupe_tests::stores::operator_audit(action, target)
}

/// The sessions whose callback is due, in every shard.
async fn callbacks_due<S: Store>(store: &S) -> Vec<String> {
    let work = store.driver_work(ShardSet::ALL).await.unwrap();
    work.callbacks_due
        .into_iter()
        .map(|(_, id)| id.to_string())
        .collect()
}

fn message(id: &str) -> NewMessage {
    NewMessage {
        message_id: id.to_owned(),
        sender: Principal::Troupe,
        body: format!("notice {id}"),
    }
}

/// A root `parent` and its CALLBACK-mode child `child`.
async fn family<S: Store>(store: &S, parent: &str, child: &str) {
    store
        .create_root(
            new_session(parent, false),
            None,
            audit(Action::CreateRootSession, parent),
            &|_| Ok(QuotaLeft::default()),
        )
        .await
        .expect("root");
    let created = store
        .create_child(
            &parent.into(),
            new_session(child, true),
            None,
            audit(Action::CreateSession, child),
            &stores::admit_child,
        )
        .await
        .expect("child");
    assert!(matches!(created, Created::New { .. }));
}

/// Takes the lease for `holder` once the current term is out.
async fn take_over<S: Store>(store: &S, holder: &Holder) -> Fence {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(fence) = store.acquire_lease(holder, TTL).await.expect("acquire") {
            return fence;
        }
        assert!(Instant::now() < deadline, "the lease was never free again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn fenced<T: std::fmt::Debug>(what: &str, result: Result<T, SessionError>, epoch: i64) {
    match result {
        Err(SessionError::Fenced { epoch: e }) => assert_eq!(e, epoch, "{what}"),
        other => panic!("{what}: a stale owner's write passed: {other:?}"),
    }
}

/// One holder at a time; a takeover only after the term is out, with the
/// next epoch; every write of the old term refused afterwards, changing
/// nothing; the new term's writes pass.
async fn one_holder_and_stale_writes_refused<S: Store>(store: &S) {
    family(store, "p", "c").await;
    let (a, b) = (Holder::named("a"), Holder::named("b"));
    let old = store
        .acquire_lease(&a, TTL)
        .await
        .unwrap()
        .expect("free lease");
    assert!(
        store.acquire_lease(&b, TTL).await.unwrap().is_none(),
        "held"
    );
    assert!(
        store.renew_lease(&old, TTL).await.unwrap(),
        "renewed while live"
    );
    troupe_tests::embedded_runner(store, &old).await;
    store
        .start_process(&old, &"c".into())
        .await
        .expect("owner's write");
    store
        .record_process(&old, &"c".into(), 1, ProcessChange::Started, 64)
        .await
        .expect("owner's write");
    let new = take_over(store, &b).await;
    assert_eq!(new.epoch, old.epoch + 1, "the epoch is the fencing token");
    assert!(
        !store.renew_lease(&old, TTL).await.unwrap(),
        "a lost term stays lost"
    );
    let lease = store.lease().await.unwrap().expect("lease");
    assert_eq!(
        (lease.holder, lease.epoch, lease.live),
        (b.clone(), new.epoch, true)
    );

    let before = store.process(&"c".into()).await.unwrap().expect("process");
    let events = store.event_heads().await.unwrap();
    let output = ProcessChange::Output {
        stream: "stdout",
        data: b"late".to_vec(),
    };
    fenced(
        "record_process",
        store.record_process(&old, &"c".into(), 2, output, 64).await,
        old.epoch,
    );
    fenced(
        "mark_delivered",
        store.mark_delivered(&old, &"c".into(), 1).await,
        old.epoch,
    );
    fenced(
        "start_process",
        store.start_process(&old, &"p".into()).await,
        old.epoch,
    );
    fenced(
        "fail_session",
        store
            .fail_session(
                &old,
                &"c".into(),
                Failure::Lost,
                "x",
                audit(Action::RunnerLost, "c"),
            )
            .await,
        old.epoch,
    );
    fenced(
        "mark_stopped",
        store.mark_stopped(&old, &"c".into(), false).await,
        old.epoch,
    );
    fenced(
        "write_callback",
        store
            .write_callback(
                &old,
                &"c".into(),
                message("m0"),
                audit(Action::Callback, "p"),
            )
            .await,
        old.epoch,
    );
    fenced("prune_events", store.prune_events(&old, 0).await, old.epoch);
    assert_eq!(
        store.process(&"c".into()).await.unwrap().expect("process"),
        before
    );
    assert!(
        store.process(&"p".into()).await.unwrap().is_none(),
        "no process made"
    );
    assert_eq!(
        store.event_heads().await.unwrap(),
        events,
        "no event written"
    );
    assert_eq!(
        store
            .get_session(&"c".into())
            .await
            .unwrap()
            .unwrap()
            .status,
        SessionStatus::Running
    );
    // The new owner writes; released, the lease is free at once.
    store
        .record_process(&new, &"c".into(), 2, ProcessChange::Started, 64)
        .await
        .expect("new owner's write");
    store.release_lease(&new).await.unwrap();
    let next = store
        .acquire_lease(&a, TTL)
        .await
        .unwrap()
        .expect("released");
    assert_eq!(next.epoch, new.epoch + 1);
    fenced(
        "after release",
        store.mark_delivered(&new, &"c".into(), 1).await,
        new.epoch,
    );
}

/// The exit of a CALLBACK-mode child makes its notice due in the same
/// commit; it is written once, whoever writes it, and then cleared.
async fn a_due_callback_is_written_once<S: Store>(store: &S) {
    family(store, "p", "c").await;
    let fence = store
        .acquire_lease(&Holder::named("a"), Duration::from_secs(3600))
        .await
        .unwrap()
        .expect("free lease");
    troupe_tests::embedded_runner(store, &fence).await;
    store.start_process(&fence, &"c".into()).await.unwrap();
    store
        .record_process(&fence, &"c".into(), 1, ProcessChange::Started, 64)
        .await
        .unwrap();
    assert!(callbacks_due(store).await.is_empty());
    let exit = ProcessChange::Exited(ProcessExit {
        code: 3,
        reason: ExitReason::Exited,
        detail: String::new(),
    });
    store
        .record_process(&fence, &"c".into(), 2, exit, 64)
        .await
        .unwrap();
    assert!(
        store
            .process(&"c".into())
            .await
            .unwrap()
            .unwrap()
            .callback_due
    );
    assert_eq!(callbacks_due(store).await, ["c"]);
    let inbox = store.inbox_count(&"p".into()).await.unwrap();
    let first = store
        .write_callback(
            &fence,
            &"c".into(),
            message("m1"),
            audit(Action::Callback, "p"),
        )
        .await
        .unwrap();
    assert!(first.is_some(), "written");
    let again = store
        .write_callback(
            &fence,
            &"c".into(),
            message("m2"),
            audit(Action::Callback, "p"),
        )
        .await
        .unwrap();
    assert!(again.is_none(), "once");
    assert_eq!(store.inbox_count(&"p".into()).await.unwrap(), inbox + 1);
    assert!(
        !store
            .process(&"c".into())
            .await
            .unwrap()
            .unwrap()
            .callback_due
    );
    assert!(callbacks_due(store).await.is_empty());
}

#[tokio::test]
async fn sqlite_one_holder_and_stale_writes_refused() {
    let (_dir, store) = sqlite().await;
    one_holder_and_stale_writes_refused(&store).await;
}

#[tokio::test]
async fn postgres_one_holder_and_stale_writes_refused() {
    one_holder_and_stale_writes_refused(&postgres().await).await;
}

#[tokio::test]
async fn sqlite_a_due_callback_is_written_once() {
    let (_dir, store) = sqlite().await;
    a_due_callback_is_written_once(&store).await;
}

#[tokio::test]
async fn postgres_a_due_callback_is_written_once() {
    a_due_callback_is_written_once(&postgres().await).await;
}
