//! WatchSessions: hierarchy fields, resuming without gaps or repeats,
//! visibility, and expired cursors.

use std::time::Duration;

use tokio_stream::StreamExt;
use tonic::{Code, Streaming};
use troupe_proto::session::{self as pb, EventKind, TrustLevel};
use troupe_session_svc::{cursor::Cursor, shard::Shard};
use troupe_tests::{TestServer, child, create_child, message, reason, terminate};

/// The position in `workspace`'s shard an event's cursor stands at.
fn position(event: &pb::SessionEvent, workspace: &str) -> i64 {
    troupe_tests::position(&event.cursor, workspace)
}

async fn next(stream: &mut Streaming<pb::SessionEvent>) -> pb::SessionEvent {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("an event within 10 s")
        .expect("stream open")
        .expect("event")
}

#[tokio::test]
async fn watchers_see_hierarchy_fields_and_resume_without_gap_or_repeat() {
    let server = TestServer::start().await;
    let mut op = server.operator().await;
    let (root, mut as_root, _) = server.root("alpha", TrustLevel::Direct).await;
    let mut stream = op
        .watch_sessions(pb::WatchSessionsRequest {
            tree_id: root.tree_id.clone(),
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    // History: the root's created and initial-message events.
    let created = next(&mut stream).await;
    assert_eq!(
        (created.kind, created.sequence, created.depth),
        (EventKind::Created as i32, 1, 0)
    );
    assert_eq!(created.session_id, root.session_id);
    assert_eq!(created.tree_id, root.tree_id);
    let initial = next(&mut stream).await;
    assert_eq!(
        (initial.kind, initial.sequence),
        (EventKind::Message as i32, 2)
    );

    // Live: a child appears with its hierarchy fields.
    let kid = create_child(&mut as_root, child("kid")).await;
    let kid_created = next(&mut stream).await;
    assert_eq!(kid_created.session_id, kid.session_id);
    assert_eq!(kid_created.parent_session_id, root.session_id);
    assert_eq!((kid_created.depth, kid_created.sequence), (1, 1));
    let last_seen = next(&mut stream).await.cursor; // the kid's initial message
    drop(stream);

    // Events while nobody watches, then resume after the last cursor seen.
    as_root
        .send_message(message(kid.session_id.clone(), "more"))
        .await
        .expect("send");
    op.terminate_session(terminate(root.session_id.clone()))
        .await
        .expect("terminate");
    let mut resumed = op
        .watch_sessions(pb::WatchSessionsRequest {
            tree_id: root.tree_id.clone(),
            after: last_seen.clone(),
            ..Default::default()
        })
        .await
        .expect("resume")
        .into_inner();
    let mut kinds = Vec::new();
    let mut at = last_seen
        .parse::<Cursor>()
        .unwrap()
        .after(Shard::of("alpha"));
    assert_eq!(
        last_seen,
        format!("{}:{at}", Shard::of("alpha")),
        "a tree's cursor names its one shard"
    );
    for _ in 0..3 {
        let event = next(&mut resumed).await;
        assert!(position(&event, "alpha") > at, "positions only grow");
        at = position(&event, "alpha");
        kinds.push((
            EventKind::try_from(event.kind).expect("kind"),
            event.session_id.clone(),
            event.sequence,
        ));
    }
    assert_eq!(
        kinds,
        [
            (EventKind::Message, kid.session_id.clone(), 3),
            (EventKind::Terminated, root.session_id.clone(), 3),
            (EventKind::Terminated, kid.session_id.clone(), 4),
        ]
    );
    // Nothing more: the next event is not a repeat.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), resumed.next())
            .await
            .is_err()
    );
    server.stop().await;
}

#[tokio::test]
async fn sandboxed_watchers_never_see_direct_sessions() {
    let server = TestServer::start().await;
    let (direct, mut as_direct, _) = server.root("alpha", TrustLevel::Direct).await;
    let kid = create_child(
        &mut as_direct,
        pb::CreateSessionRequest {
            trust_level: TrustLevel::Sandboxed as i32,
            ..child("kid")
        },
    )
    .await;
    server.root("beta", TrustLevel::Sandboxed).await;
    let mut as_kid = server.act_as(&kid.session_id).await;
    // Workspace-wide history as the sandboxed kid sees it.
    let mut stream = as_kid
        .watch_sessions(pb::WatchSessionsRequest::default())
        .await
        .expect("watch")
        .into_inner();
    let first = next(&mut stream).await;
    assert_eq!(first.session_id, kid.session_id);
    assert_eq!(
        first.parent_session_id, "",
        "the direct parent stays hidden"
    );
    let _kid_message = next(&mut stream).await;
    // New direct activity stays invisible; sandboxed activity shows.
    as_direct
        .create_session(child("direct sibling"))
        .await
        .expect("direct child");
    as_direct
        .send_message(message(direct.session_id.clone(), "self"))
        .await
        .expect("send");
    let (sandboxed_peer, _, _) = server.root("alpha", TrustLevel::Sandboxed).await;
    let seen = next(&mut stream).await;
    assert_eq!(
        seen.session_id, sandboxed_peer.session_id,
        "direct events were skipped"
    );
    assert_eq!(seen.trust_level, TrustLevel::Sandboxed as i32);
    // The tree filter does not widen what it may see either.
    let mut by_tree = as_kid
        .watch_sessions(pb::WatchSessionsRequest {
            tree_id: direct.tree_id.clone(),
            ..Default::default()
        })
        .await
        .expect("watch tree")
        .into_inner();
    let event = next(&mut by_tree).await;
    assert_eq!(event.session_id, kid.session_id);
    let event = next(&mut by_tree).await;
    assert_eq!(event.session_id, kid.session_id);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), by_tree.next())
            .await
            .is_err()
    );
    server.stop().await;
}

#[tokio::test]
async fn a_cursor_older_than_what_is_kept_is_refused() {
    let mut server = TestServer::start_with(|c| c.event_retention = 3).await;
    let (root, _, _) = server.root("alpha", TrustLevel::Direct).await;
    let mut op = server.operator().await;
    for i in 0..5 {
        op.send_message(pb::SendMessageRequest {
            session_id: root.session_id.clone(),
            message: format!("m{i}"),
            request_id: String::new(),
        })
        .await
        .expect("send");
    }
    // The service prunes when it starts (and every few seconds after): 7
    // events, 3 kept, so events 1 to 4 are gone.
    server.restart().await;
    let mut op = server.operator().await;
    let shard = Shard::of("alpha");
    // Of every workspace, or of alpha alone: a cursor before the mark of
    // alpha's shard has expired; one that names no shard stands at 0 in
    // each, and has too.
    for (workspace, after) in [
        ("", format!("{shard}:1")),
        ("alpha", format!("{shard}:1")),
        ("", "0:0".to_owned()),
    ] {
        let status = op
            .watch_sessions(pb::WatchSessionsRequest {
                workspace_id: workspace.into(),
                after: after.clone(),
                ..Default::default()
            })
            .await
            .expect_err("expired");
        assert_eq!(
            (status.code(), reason(&status).as_str()),
            (Code::OutOfRange, "CURSOR_EXPIRED"),
            "{workspace:?} after {after:?}"
        );
    }
    // From the oldest kept, or from the pruning mark exactly, works.
    for after in [String::new(), format!("{shard}:4")] {
        let mut stream = op
            .watch_sessions(pb::WatchSessionsRequest {
                workspace_id: "alpha".into(),
                after,
                ..Default::default()
            })
            .await
            .expect("watch")
            .into_inner();
        assert_eq!(position(&next(&mut stream).await, "alpha"), 5);
    }
    server.stop().await;
}

/// A numeric cursor of a release before shards is refused, with what to do
/// instead, in either field; so is text that is no cursor, and a cursor
/// longer than a pair per shard (read no further than its length).
#[tokio::test]
async fn an_old_numeric_cursor_is_refused_clearly() {
    let server = TestServer::start().await;
    server.root("alpha", TrustLevel::Direct).await;
    let mut op = server.operator().await;
    #[allow(deprecated)]
    let numeric = pb::WatchSessionsRequest {
        after_cursor: 2,
        ..Default::default()
    };
    let as_text = pb::WatchSessionsRequest {
        after: "2".into(),
        ..Default::default()
    };
    let garbage = pb::WatchSessionsRequest {
        after: "22:x".into(),
        ..Default::default()
    };
    let too_long = pb::WatchSessionsRequest {
        after: "1:1,".repeat(100_000),
        ..Default::default()
    };
    for (request, says) in [
        (numeric, "numeric cursors are no longer accepted"),
        (as_text, "numeric cursor of a release before"),
        (garbage, "not a cursor"),
        (too_long, "at most"),
    ] {
        let status = op.watch_sessions(request).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(says), "{}", status.message());
    }
    server.stop().await;
}

#[tokio::test]
async fn a_live_watch_starts_after_what_is_stored() {
    let server = TestServer::start().await;
    let (root, _, _) = server.root("alpha", TrustLevel::Direct).await;
    let mut op = server.operator().await;
    let mut live = op
        .watch_sessions(pb::WatchSessionsRequest {
            live_only: true,
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    op.send_message(message(root.session_id.clone(), "héllo"))
        .await
        .expect("send");
    let event = next(&mut live).await;
    assert_eq!(
        event.kind,
        EventKind::Message as i32,
        "the stored history is skipped"
    );
    let Some(pb::session_event::Detail::Message(detail)) = event.detail else {
        panic!("a message event carries its detail: {event:?}");
    };
    assert_eq!(
        (detail.inbox_sequence, detail.bytes),
        (2, 6),
        "bytes, not characters"
    );
    server.stop().await;
}

/// A session reports its own progress; its watchers see it as an event
/// with the hierarchy fields. The operator, who is no session, cannot; nor
/// can a session that has ended; a percentage over 100 is refused.
#[tokio::test]
async fn progress_is_a_sessions_own_event() {
    let server = TestServer::start().await;
    let mut op = server.operator().await;
    let (root, mut as_root, _) = server.root("alpha", TrustLevel::Direct).await;
    let kid = create_child(&mut as_root, child("worker")).await;
    let mut as_kid = server.act_as(&kid.session_id).await;
    let mut stream = op
        .watch_sessions(pb::WatchSessionsRequest {
            tree_id: root.tree_id.clone(),
            live_only: true,
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    let reported = as_kid
        .report_progress(pb::ReportProgressRequest {
            progress: 40,
            description: "indexing".into(),
        })
        .await
        .expect("report")
        .into_inner();
    let event = next(&mut stream).await;
    assert_eq!(event.kind, EventKind::Progress as i32);
    assert_eq!(event.sequence, reported.sequence);
    assert_eq!(
        (
            event.session_id.as_str(),
            event.parent_session_id.as_str(),
            event.depth
        ),
        (kid.session_id.as_str(), root.session_id.as_str(), 1)
    );
    assert_eq!(
        event.detail,
        Some(pb::session_event::Detail::Progress(pb::Progress {
            progress: 40,
            description: "indexing".into(),
        }))
    );

    let status = op
        .report_progress(pb::ReportProgressRequest::default())
        .await
        .expect_err("the operator is no session");
    assert_eq!(
        (status.code(), reason(&status).as_str()),
        (Code::PermissionDenied, "SESSION_ONLY")
    );
    let status = as_kid
        .report_progress(pb::ReportProgressRequest {
            progress: 101,
            description: String::new(),
        })
        .await
        .expect_err("not a percentage");
    assert_eq!(status.code(), Code::InvalidArgument);
    op.terminate_session(terminate(kid.session_id.clone()))
        .await
        .expect("terminate");
    let status = as_kid
        .report_progress(pb::ReportProgressRequest::default())
        .await
        .expect_err("ended");
    assert_eq!(reason(&status), "TOKEN_REVOKED");
    server.stop().await;
}
