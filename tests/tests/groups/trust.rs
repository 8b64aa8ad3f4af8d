//! Who a broadcast or a group post reaches, and who sees whom in a group.

use tonic::Code;
use troupe_proto::session as pb;
use troupe_tests::{reason, terminate};

use super::{DELIVERED, ENDED, World, broadcast, groups_of, new_group, post};

#[tokio::test]
async fn broadcast_reaches_exactly_the_sessions_the_sender_may_message_once_each() {
    let w = World::start(|_| {}).await;
    // (sender, scope, recipients): SendMessage's rule for every recipient.
    let cases: &[(&str, pb::BroadcastScope, &[&str])] = &[
        (
            "direct",
            pb::BroadcastScope::Workspace,
            &["child", "direct2", "sandboxed", "sandboxed2"],
        ),
        (
            "sandboxed",
            pb::BroadcastScope::Workspace,
            &["child", "sandboxed2"],
        ),
        // A sandboxed child does not reach its direct parent by broadcast.
        (
            "child",
            pb::BroadcastScope::Workspace,
            &["sandboxed", "sandboxed2"],
        ),
        ("direct", pb::BroadcastScope::Children, &["child"]),
        ("direct", pb::BroadcastScope::Subtree, &["child"]),
        ("direct2", pb::BroadcastScope::Children, &[]),
        ("beta_sandboxed", pb::BroadcastScope::Workspace, &[]),
        (
            "beta_direct",
            pb::BroadcastScope::Unspecified,
            &["beta_sandboxed"],
        ),
    ];
    for &(sender, scope, expected) in cases {
        let before = w.inboxes().await;
        let answer = w
            .client(sender)
            .broadcast(broadcast("hello all", scope))
            .await
            .unwrap_or_else(|s| panic!("{sender} {scope:?}: {s:?}"))
            .into_inner();
        let case = format!("{sender} broadcasts to {scope:?}");
        assert_eq!(w.names(&answer.recipients, DELIVERED), expected, "{case}");
        assert_eq!(
            answer.recipients.len(),
            expected.len(),
            "{case}: {answer:?}"
        );
        assert_eq!(w.grown_once(&before).await, expected, "{case}: inboxes");
        for r in &answer.recipients {
            assert!(
                r.message_id.starts_with("msg_") && r.sequence >= 2,
                "{case}: {r:?}"
            );
        }
    }
}

#[tokio::test]
async fn group_posts_reach_members_the_poster_may_message_and_hide_the_others() {
    let w = World::start(|_| {}).await;
    let mut direct = w.client("direct");
    let created = direct
        .create_group(new_group("team"))
        .await
        .expect("create")
        .into_inner();
    assert_eq!(
        created.group.expect("group").member_ids,
        [w.ids["direct"].clone()]
    );
    direct
        .add_group_members(w.members("team", &["sandboxed", "direct2", "sandboxed2", "child"]))
        .await
        .expect("add");

    // (poster, recipients): the members the poster may message and that may
    // message it back. A sandboxed member never hears a direct poster in a
    // group (though a direct session may message it on its own).
    let cases: &[(&str, &[&str])] = &[
        ("direct", &["direct2"]),
        ("direct2", &["direct"]),
        ("sandboxed", &["child", "sandboxed2"]),
        ("child", &["sandboxed", "sandboxed2"]),
    ];
    for &(poster, expected) in cases {
        let before = w.inboxes().await;
        let answer = w
            .client(poster)
            .post_to_group(post("team", "to the team"))
            .await
            .unwrap_or_else(|s| panic!("{poster}: {s:?}"))
            .into_inner();
        // A sandboxed poster's answer names no direct member.
        assert_eq!(w.names(&answer.recipients, DELIVERED), expected, "{poster}");
        assert_eq!(
            answer.recipients.len(),
            expected.len(),
            "{poster}: {answer:?}"
        );
        assert_eq!(w.grown_once(&before).await, expected, "{poster}: inboxes");
    }

    // Each member lists the group with the members it may see.
    for (member, sees) in [
        (
            "direct2",
            &["child", "direct", "direct2", "sandboxed", "sandboxed2"][..],
        ),
        ("sandboxed", &["child", "sandboxed", "sandboxed2"][..]),
    ] {
        let groups = groups_of(&mut w.client(member)).await;
        assert_eq!(groups.len(), 1, "{member}");
        let mut names: Vec<&str> = groups[0]
            .member_ids
            .iter()
            .map(|id| w.name_of(id))
            .collect();
        names.sort_unstable();
        assert_eq!(names, sees, "{member} lists");
    }
    // Another workspace's session is no member: the group is as none.
    let outsider = w
        .client("beta_direct")
        .post_to_group(post("team", "hi"))
        .await
        .expect_err("another workspace's group");
    assert_eq!(reason(&outsider), "GROUP_NOT_FOUND");
    assert_eq!(outsider.code(), Code::NotFound);
}

#[tokio::test]
async fn ended_members_are_reported_and_the_rest_still_receive() {
    let w = World::start(|_| {}).await;
    let mut poster = w.client("sandboxed");
    poster
        .create_group(new_group("crew"))
        .await
        .expect("create");
    poster
        .add_group_members(w.members("crew", &["sandboxed2", "child"]))
        .await
        .expect("add");
    w.server
        .operator()
        .await
        .terminate_session(terminate(w.ids["child"].clone()))
        .await
        .expect("terminate");
    let before = w.inboxes().await;
    let answer = poster
        .post_to_group(post("crew", "still there?"))
        .await
        .expect("post")
        .into_inner();
    assert_eq!(w.names(&answer.recipients, DELIVERED), ["sandboxed2"]);
    assert_eq!(w.names(&answer.recipients, ENDED), ["child"]);
    assert_eq!(w.grown_once(&before).await, ["sandboxed2"]);
    let ended = answer
        .recipients
        .iter()
        .find(|r| r.outcome == ENDED as i32)
        .expect("ended");
    assert!(
        ended.message_id.is_empty() && ended.sequence == 0,
        "{ended:?}"
    );
}

#[tokio::test]
async fn the_operator_broadcasts_to_a_named_workspace_but_keeps_out_of_groups() {
    let w = World::start(|_| {}).await;
    let mut operator = w.server.operator().await;
    let before = w.inboxes().await;
    let answer = operator
        .broadcast(pb::BroadcastRequest {
            workspace_id: "beta".to_owned(),
            ..broadcast("notice", pb::BroadcastScope::Workspace)
        })
        .await
        .expect("operator broadcast")
        .into_inner();
    assert_eq!(
        w.names(&answer.recipients, DELIVERED),
        ["beta_direct", "beta_sandboxed"]
    );
    assert_eq!(
        w.grown_once(&before).await,
        ["beta_direct", "beta_sandboxed"]
    );
    let subtree = operator
        .broadcast(broadcast("x", pb::BroadcastScope::Subtree))
        .await
        .expect_err("the operator has no subtree");
    assert_eq!(subtree.code(), Code::InvalidArgument);
    let group = operator
        .create_group(new_group("ops"))
        .await
        .expect_err("sessions only");
    assert_eq!(reason(&group), "SESSION_ONLY");
    // A session names only its own workspace.
    let other = w
        .client("direct")
        .broadcast(pb::BroadcastRequest {
            workspace_id: "beta".to_owned(),
            ..broadcast("x", pb::BroadcastScope::Workspace)
        })
        .await
        .expect_err("another workspace");
    assert_eq!(other.code(), Code::NotFound);
    // The operator lists a workspace's groups, every member shown.
    w.client("sandboxed")
        .create_group(new_group("seen"))
        .await
        .expect("create");
    let listed = operator
        .list_groups(pb::ListGroupsRequest {
            workspace_id: "alpha".to_owned(),
        })
        .await
        .expect("list")
        .into_inner()
        .groups;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].member_ids, [w.ids["sandboxed"].clone()]);
    let beta = operator
        .list_groups(pb::ListGroupsRequest {
            workspace_id: "beta".to_owned(),
        })
        .await
        .expect("list");
    assert!(
        beta.into_inner().groups.is_empty(),
        "workspaces never cross"
    );
}

#[tokio::test]
async fn each_recipient_of_a_broadcast_has_one_message_event_on_the_watch_stream() {
    use pb::session_event::Detail;
    let w = World::start(|_| {}).await;
    let mut operator = w.server.operator().await;
    let mut stream = operator
        .watch_sessions(pb::WatchSessionsRequest {
            workspace_id: "alpha".to_owned(),
            live_only: true,
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    let answer = w
        .client("sandboxed")
        .broadcast(broadcast("watched", pb::BroadcastScope::Workspace))
        .await
        .expect("broadcast")
        .into_inner();
    let mut expected: Vec<(String, String, u64)> = answer
        .recipients
        .iter()
        .map(|r| (r.session_id.clone(), r.message_id.clone(), r.sequence))
        .collect();
    expected.sort();
    let mut seen = Vec::new();
    while seen.len() < expected.len() {
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), stream.message())
            .await
            .expect("the message events within 10 s")
            .expect("stream")
            .expect("an event");
        if let Some(Detail::Message(m)) = event.detail {
            seen.push((event.session_id, m.message_id, m.inbox_sequence));
        }
    }
    seen.sort();
    assert_eq!(seen, expected, "one message event per recipient");
    // And no more: a marker message comes next, not a second copy.
    operator
        .send_message(troupe_tests::message(w.ids["direct"].clone(), "marker"))
        .await
        .expect("marker");
    let next = tokio::time::timeout(std::time::Duration::from_secs(10), stream.message())
        .await
        .expect("the marker's event")
        .expect("stream")
        .expect("an event");
    assert_eq!(next.session_id, w.ids["direct"], "{next:?}");
}
