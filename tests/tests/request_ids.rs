//! Request ids are remembered for `--request-id-retention-secs`: a retry
//! within the window replays the first call's answer, a retry after it is
//! a new call, and the owner of the background work prunes the records
//! past it, in bounded batches, under its fence. The server tests run on
//! the harness's backend (`TROUPE_TEST_BACKEND`); the store tests on both.

use std::time::{Duration, Instant};

use sqlx::Connection;
use troupe_proto::session::{self as pb, TrustLevel};
use troupe_session_svc::{
    error::{QuotaLeft, SessionError},
    model::{Action, Idempotency, NewMessage, NewSession, Principal, Trust, now_ms},
    store::{Created, Fence, Holder, prelude::*},
};
use troupe_tests::{
    TestServer, child,
    postgres::is_postgres,
    stores::{self, operator_audit as audit},
};

/// A create retried within the window replays; after it, the same request
/// id (even with another payload) is a new call, which replays in turn.
#[tokio::test]
async fn a_retry_replays_within_the_window_and_is_new_after_it() {
    let server = TestServer::start_with(|c| c.request_id_retention_secs = 1).await;
    let (root, mut as_root, _) = server.root("alpha", TrustLevel::Direct).await;
    let create = pb::CreateSessionRequest {
        request_id: "r1".into(),
        ..child("once")
    };
    let send = pb::SendMessageRequest {
        session_id: root.session_id.clone(),
        message: "hi".into(),
        request_id: "m1".into(),
    };
    let started = Instant::now();
    let first = as_root.create_session(create.clone()).await.unwrap();
    let sent = as_root
        .send_message(send.clone())
        .await
        .unwrap()
        .into_inner();
    let id = |r: tonic::Response<pb::CreateSessionResponse>| r.into_inner().session.unwrap();
    let first = id(first).session_id;
    let again = id(as_root.create_session(create.clone()).await.unwrap());
    let resent = as_root
        .send_message(send.clone())
        .await
        .unwrap()
        .into_inner();
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "the retries were not within the window; the test proves nothing"
    );
    assert_eq!(again.session_id, first, "a retry within the window replays");
    assert_eq!(
        (&resent.message_id, resent.sequence),
        (&sent.message_id, sent.sequence)
    );

    tokio::time::sleep(Duration::from_millis(1100).saturating_sub(started.elapsed())).await;
    let later = id(as_root.create_session(create.clone()).await.unwrap()).session_id;
    assert_ne!(later, first, "after the window the call is new");
    let later_again = id(as_root.create_session(create.clone()).await.unwrap()).session_id;
    assert_eq!(later_again, later, "and its own retry replays it");
    let resent = as_root
        .send_message(pb::SendMessageRequest {
            message: "another payload".into(),
            ..send
        })
        .await
        .expect("an expired request id is no conflict")
        .into_inner();
    assert_ne!(resent.message_id, sent.message_id);
    assert_eq!(resent.sequence, sent.sequence + 1);
    assert_eq!(server.get(&root.session_id).await.children.len(), 2);
    server.stop().await;
}

/// The owner of the background work prunes the records past the window.
#[tokio::test]
async fn the_owner_prunes_request_ids_past_the_window() {
    let server = TestServer::start_with(|c| {
        c.request_id_retention_secs = 1;
        // On PostgreSQL only a service with a runner owns the background
        // work; none answers here, which pruning does not need.
        c.runner = Some("http://127.0.0.1:9".into());
    })
    .await;
    let (root, mut as_root, _) = server.root("alpha", TrustLevel::Direct).await;
    for i in 0..5 {
        as_root
            .send_message(pb::SendMessageRequest {
                session_id: root.session_id.clone(),
                message: format!("m{i}"),
                request_id: format!("m{i}"),
            })
            .await
            .unwrap();
    }
    let url = server.config.database_url();
    assert_eq!(request_ids(&url).await, 5);
    // Pruning runs at the start of the owner's term and every 5 s.
    let deadline = Instant::now() + Duration::from_secs(20);
    while request_ids(&url).await > 0 {
        assert!(Instant::now() < deadline, "request ids were never pruned");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.stop().await;
}

/// Counts the request-id records of callers' calls, read on a connection
/// of the test's own.
async fn request_ids(url: &str) -> i64 {
    const COUNT: &str = "SELECT COUNT(*) FROM idempotency WHERE action <> 'callback'";
    if is_postgres(url) {
        let mut db = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query_scalar(COUNT).fetch_one(&mut db).await.unwrap()
    } else {
        let mut db = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query_scalar(COUNT).fetch_one(&mut db).await.unwrap()
    }
}

fn key(action: Action, request_id: &str, window_start_ms: i64) -> Option<Idempotency> {
    Some(Idempotency {
        caller: Principal::Operator,
        action,
        request_id: request_id.to_owned(),
        payload_hash: "payload".to_owned(),
        window_start_ms,
    })
}

fn root(id: &str) -> NewSession {
    stores::new_session(id, Trust::Direct)
}

async fn create_root<S: Store>(store: &S, id: &str, idem: Option<Idempotency>) -> Created {
    store
        .create_root(
            root(id),
            idem,
            audit(Action::CreateRootSession, id),
            &|_| Ok(QuotaLeft::default()),
        )
        .await
        .expect("root")
}

/// Sends a message to `p`; returns its sequence and whether it replayed.
async fn send<S: Store>(store: &S, id: &str, idem: Option<Idempotency>) -> (u64, bool) {
    let message = NewMessage {
        message_id: id.to_owned(),
        sender: Principal::Operator,
        body: id.to_owned(),
    };
    let sent = store
        .send_message(
            &"p".into(),
            message,
            idem,
            audit(Action::SendMessage, "p"),
            troupe_tests::stores::UNBOUNDED,
            &|_| Ok(()),
        )
        .await
        .expect("send");
    (sent.sequence, sent.replayed)
}

/// Pruning deletes at most its batch per call, only records made before
/// its cutoff and only of callers' calls (not the callback guard), and
/// only under the live fence; a pruned request id is a new call even to a
/// key whose window never ends, a kept one still replays. A record past
/// the key's window is taken over at lookup, before any pruning.
async fn pruned_in_batches_under_the_fence<S: Store>(store: &S) {
    const NEVER: i64 = i64::MIN;
    create_root(store, "p", None).await;
    // Every action that carries a caller's request id is pruned alike.
    let actions = [
        Action::SendMessage,
        Action::ReplyToParent,
        Action::Broadcast,
        Action::PostToGroup,
    ];
    for i in 0..20 {
        send(
            store,
            &format!("old{i}"),
            key(actions[i % actions.len()], &format!("old{i}"), NEVER),
        )
        .await;
    }
    create_root(store, "q", key(Action::CreateRootSession, "root", NEVER)).await;
    // The callback guard is a request-id record too, never pruned.
    send(store, "guard", key(Action::Callback, "guard", NEVER)).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let cutoff = now_ms();
    tokio::time::sleep(Duration::from_millis(5)).await;
    send(store, "new", key(Action::SendMessage, "new", NEVER)).await;

    let fence = store
        .acquire_lease(&Holder::named("owner"), Duration::from_secs(3600))
        .await
        .unwrap()
        .expect("free lease");
    let stale = Fence {
        holder: Holder::named("someone else"),
        ..fence.clone()
    };
    match store.prune_request_ids(&stale, cutoff, 100).await {
        Err(SessionError::Fenced { .. }) => {}
        other => panic!("a stale owner pruned: {other:?}"),
    }
    let mut batches = Vec::new();
    loop {
        let n = store.prune_request_ids(&fence, cutoff, 8).await.unwrap();
        batches.push(n);
        if n < 8 {
            break;
        }
    }
    assert_eq!(batches, [8, 8, 5], "21 records past the cutoff, 8 a batch");

    let (seq, replayed) = send(store, "again", key(Action::SendMessage, "old4", NEVER)).await;
    assert!(!replayed, "a pruned request id is a new call");
    assert_eq!(seq, 23, "after 22 sends");
    assert!(matches!(
        create_root(store, "q2", key(Action::CreateRootSession, "root", NEVER)).await,
        Created::New { .. }
    ));
    assert_eq!(
        send(store, "new?", key(Action::SendMessage, "new", NEVER)).await,
        (22, true),
        "a record after the cutoff is kept"
    );
    assert!(
        send(store, "guard?", key(Action::Callback, "guard", NEVER))
            .await
            .1,
        "the callback guard is kept"
    );

    // Past the key's own window, a record no longer replays, pruned or not.
    let (seq, replayed) = send(
        store,
        "fresh",
        key(Action::SendMessage, "new", now_ms() + 1),
    )
    .await;
    assert!(!replayed, "a record past its window is a new call");
    assert_eq!(
        send(store, "fresh?", key(Action::SendMessage, "new", NEVER)).await,
        (seq, true),
        "the new call's record replays in turn"
    );
}

#[tokio::test]
async fn sqlite_pruned_in_batches_under_the_fence() {
    let (_dir, store) = stores::sqlite().await;
    pruned_in_batches_under_the_fence(&store).await;
}

#[tokio::test]
async fn postgres_pruned_in_batches_under_the_fence() {
    pruned_in_batches_under_the_fence(&stores::postgres().await).await;
}
