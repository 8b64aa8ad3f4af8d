//! Revocation reaches calls that are already open: a watch or a `sync`
//! create made with a session's token ends, UNAUTHENTICATED, as soon as a
//! new call with that token would be refused (its session ended, the token
//! expired), and never hands over what it waited for.

use std::time::{Duration, Instant};

use tokio_stream::StreamExt;
use tonic::{Code, Status, Streaming};
use troupe_proto::session::{self as pb, TrustLevel};
use troupe_tests::{TestServer, child, reason, terminate};

/// How soon an open call must learn of a revocation.
const PROMPTLY: Duration = Duration::from_secs(5);

/// Reads `stream` until it ends; returns how it ended.
async fn end_of(stream: &mut Streaming<pb::SessionEvent>) -> Status {
    let deadline = Instant::now() + PROMPTLY;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.next()).await {
            Err(_) => panic!("the watch still runs {PROMPTLY:?} after its token lapsed"),
            Ok(None) => panic!("the watch ended without a status"),
            Ok(Some(Ok(_event))) => continue,
            Ok(Some(Err(status))) => return status,
        }
    }
}

fn watch_workspace(workspace: &str) -> pb::WatchSessionsRequest {
    pb::WatchSessionsRequest {
        workspace_id: workspace.to_owned(),
        live_only: true,
        ..Default::default()
    }
}

#[tokio::test]
async fn a_watch_ends_when_its_session_is_terminated() {
    let server = TestServer::start().await;
    let mut op = server.operator().await;
    let (watcher, mut as_watcher, _) = server.root("alpha", TrustLevel::Direct).await;
    let (other, _, _) = server.root("alpha", TrustLevel::Direct).await;
    let mut stream = as_watcher
        .watch_sessions(watch_workspace("alpha"))
        .await
        .expect("watch")
        .into_inner();
    op.terminate_session(terminate(watcher.session_id.clone()))
        .await
        .expect("terminate");
    let ended = end_of(&mut stream).await;
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    assert_eq!(reason(&ended), "TOKEN_REVOKED");

    // Nothing after the end: the workspace goes on without this watcher.
    op.terminate_session(terminate(other.session_id.clone()))
        .await
        .expect("terminate");
    let after = tokio::time::timeout(Duration::from_millis(300), stream.next()).await;
    assert!(
        matches!(after, Ok(None)),
        "an ended watch delivers nothing more: {after:?}"
    );
}

#[tokio::test]
async fn a_watch_ends_when_its_token_expires() {
    let server = TestServer::start_with(|c| c.token_ttl_secs = 2).await;
    let (_, mut as_root, _) = server.root("alpha", TrustLevel::Direct).await;
    let opened = Instant::now();
    let mut stream = as_root
        .watch_sessions(watch_workspace("alpha"))
        .await
        .expect("watch")
        .into_inner();
    // A quiet workspace: only the clock can end the watch.
    let ended = end_of(&mut stream).await;
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    assert_eq!(reason(&ended), "TOKEN_EXPIRED");
    assert!(
        opened.elapsed() <= Duration::from_secs(4),
        "ended within a second of the expiry: {:?}",
        opened.elapsed()
    );
}

#[tokio::test]
async fn an_operator_watch_outlives_the_sessions_it_shows() {
    let server = TestServer::start().await;
    let mut op = server.operator().await;
    let (root, _, _) = server.root("alpha", TrustLevel::Direct).await;
    let mut stream = op
        .watch_sessions(watch_workspace("alpha"))
        .await
        .expect("watch")
        .into_inner();
    op.terminate_session(terminate(root.session_id.clone()))
        .await
        .expect("terminate");
    let event = tokio::time::timeout(PROMPTLY, stream.next())
        .await
        .expect("an event")
        .expect("open")
        .expect("an event, not an end");
    assert_eq!(event.session_id, root.session_id);
}

/// A `sync` create waits on a child that cannot start (the runner is not
/// there); its caller is terminated meanwhile, which ends the child too.
/// The caller, revoked, is refused; it does not get the child's result.
#[tokio::test]
async fn a_sync_create_ends_refused_when_its_caller_is_terminated() {
    let server = TestServer::start_with(|c| {
        c.runner = Some("http://127.0.0.1:1".to_owned());
    })
    .await;
    let mut op = server.operator().await;
    let (parent, mut as_parent, _) = server.root("alpha", TrustLevel::Direct).await;
    let waiting = tokio::spawn(async move {
        as_parent
            .create_session(pb::CreateSessionRequest {
                mode: pb::ExecutionMode::Sync as i32,
                ..child("waits")
            })
            .await
    });
    // The child exists, pending, before its parent is terminated.
    let deadline = Instant::now() + PROMPTLY;
    while server.get(&parent.session_id).await.children.is_empty() {
        assert!(Instant::now() < deadline, "the child was not created");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    op.terminate_session(terminate(parent.session_id.clone()))
        .await
        .expect("terminate");
    let answer = tokio::time::timeout(PROMPTLY, waiting)
        .await
        .expect("the sync create returns once its caller is revoked")
        .expect("join");
    let refused = answer.expect_err("a revoked caller gets no result");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert_eq!(reason(&refused), "TOKEN_REVOKED");
}
