//! Parent-end policies through the service: `CreateSession.on_parent_end`
//! taken, checked and shown; a parent's termination terminating, orphaning
//! and notifying its children, as watchers, `GetSession` and the audit log
//! see it, a sandboxed child never told its direct parent's id.

use std::time::Duration;

use tonic::Code;
use troupe_proto::session::{
    self as pb, EventKind, ListAuditRequest, ParentEndPolicy, SessionStatus, TrustLevel,
    session_event::Detail,
};
use troupe_tests::{TestServer, child, create_child, reason, terminate};

fn with_policy(
    title: &str,
    policy: ParentEndPolicy,
    trust: TrustLevel,
) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        on_parent_end: policy as i32,
        trust_level: trust as i32,
        ..child(title)
    }
}

/// The events of `session_id` a client sees, from the start, until one of
/// `last` kind arrives (within ten seconds).
async fn events_until(
    client: &mut troupe_tests::Client,
    session_id: &str,
    last: EventKind,
) -> Vec<pb::SessionEvent> {
    let mut stream = client
        .watch_sessions(pb::WatchSessionsRequest {
            session_id: session_id.to_owned(),
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    let mut seen = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .unwrap_or_else(|_| panic!("no {last:?} event; saw {seen:?}"))
            .expect("stream open")
            .expect("event");
        let done = event.kind == last as i32;
        seen.push(event);
        if done {
            return seen;
        }
    }
}

#[tokio::test]
async fn create_session_takes_checks_and_shows_the_parent_end_policy() {
    let server = TestServer::start().await;
    let (_, mut as_root, _) = server.root("alpha", TrustLevel::Direct).await;
    let plain = create_child(&mut as_root, child("plain")).await;
    assert_eq!(plain.on_parent_end(), ParentEndPolicy::Terminate);
    assert!(!plain.orphaned);
    let kept = create_child(
        &mut as_root,
        with_policy("kept", ParentEndPolicy::Abandon, TrustLevel::Unspecified),
    )
    .await;
    assert_eq!(kept.on_parent_end(), ParentEndPolicy::Abandon);
    let read = server.get(&kept.session_id).await.session.unwrap();
    assert_eq!(read.on_parent_end(), ParentEndPolicy::Abandon);

    let refused = as_root
        .create_session(pb::CreateSessionRequest {
            on_parent_end: 7,
            ..child("odd")
        })
        .await
        .expect_err("an unknown policy");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("on_parent_end"), "{refused:?}");
    assert_eq!(reason(&refused), "INVALID_ARGUMENT");
}

#[tokio::test]
async fn a_parents_termination_applies_each_childs_policy() {
    let server = TestServer::start_with(|c| c.limits.max_depth = 4).await;
    let (_, mut as_root, _) = server.root("alpha", TrustLevel::Direct).await;
    let mid = create_child(&mut as_root, child("mid")).await;
    let mut as_mid = server.act_as(&mid.session_id).await;
    let sandboxed = TrustLevel::Sandboxed;
    let t = create_child(
        &mut as_mid,
        with_policy("t", ParentEndPolicy::Terminate, sandboxed),
    )
    .await;
    let a = create_child(
        &mut as_mid,
        with_policy("a", ParentEndPolicy::Abandon, sandboxed),
    )
    .await;
    let n = create_child(
        &mut as_mid,
        with_policy("n", ParentEndPolicy::Notify, sandboxed),
    )
    .await;
    let mut as_t = server.act_as(&t.session_id).await;
    let tn = create_child(
        &mut as_t,
        with_policy("tn", ParentEndPolicy::Notify, sandboxed),
    )
    .await;

    let ended = as_root
        .terminate_session(terminate(mid.session_id.clone()))
        .await
        .expect("terminate")
        .into_inner()
        .terminated_session_ids;
    assert_eq!(ended, vec![mid.session_id.clone(), t.session_id.clone()]);

    // The terminated child: its event says how its parent ended.
    let mut op = server.operator().await;
    let events = events_until(&mut op, &t.session_id, EventKind::Terminated).await;
    let Some(Detail::Terminated(detail)) = &events.last().unwrap().detail else {
        panic!("a terminated event's detail: {events:?}");
    };
    assert_eq!(
        (detail.reason.as_str(), detail.parent_ended.as_str()),
        ("cascade", "terminated")
    );

    // The orphans run on, shown as orphans; only the notified are told.
    let cases = [
        (&a, "abandon", 1, ""),
        (&n, "notify", 2, ""),
        // Its parent is sandboxed: that id it may see.
        (&tn, "notify", 2, t.session_id.as_str()),
    ];
    for (orphan, policy, inbox, parent_seen) in cases {
        let got = server.get(&orphan.session_id).await;
        let session = got.session.unwrap();
        assert!(session.orphaned, "{}", orphan.title);
        assert_eq!(session.status(), SessionStatus::Pending);
        assert_eq!(got.inbox_count, inbox, "{}", orphan.title);
        // As the sandboxed orphan itself sees it: no id of a direct parent.
        let mut as_orphan = server.act_as(&orphan.session_id).await;
        let events = events_until(&mut as_orphan, &orphan.session_id, EventKind::Orphaned).await;
        let event = events.last().unwrap();
        assert_eq!(event.parent_session_id, parent_seen, "{}", orphan.title);
        let Some(Detail::Orphaned(detail)) = &event.detail else {
            panic!("an orphaned event's detail: {event:?}");
        };
        assert_eq!(
            (detail.policy.as_str(), detail.parent_status.as_str()),
            (policy, "terminated")
        );
    }
    let root_view = server.get(&mid.session_id).await;
    assert!(!root_view.session.unwrap().orphaned);

    let entries = op
        .list_audit(ListAuditRequest {
            session_id: mid.session_id.clone(),
            ..Default::default()
        })
        .await
        .expect("audit")
        .into_inner()
        .entries;
    let entry = entries
        .iter()
        .find(|e| e.action == "parent_ended")
        .expect("the policies' audit entry");
    assert_eq!(entry.caller, "troupe");
    let detail: serde_json::Value = serde_json::from_str(&entry.detail).unwrap();
    assert_eq!(detail["terminated"], serde_json::json!([t.session_id]));
    assert_eq!(detail["abandoned"], serde_json::json!([a.session_id]));
    assert_eq!(
        detail["notified"],
        serde_json::json!([n.session_id, tn.session_id])
    );
}
