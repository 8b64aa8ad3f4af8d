//! Broadcasts and named groups through the service, on either backend
//! (`TROUPE_TEST_BACKEND`): who a message to many reaches (the trust matrix
//! of sender and recipient, workspaces never crossed, each recipient once),
//! ended recipients reported, the fan-out cap and the message rate refusing
//! before anything is stored, a request id replaying the whole answer, and
//! a sandboxed member's view of its groups.

use std::collections::BTreeMap;

use tonic::Code;
use troupe_proto::session::{self as pb, TrustLevel};
use troupe_tests::{Client, TestServer, child, create_child, message, reason, terminate};

/// Sessions of the matrix: the senders are roots of `alpha`; every other
/// session is a root too, but `child`, a sandboxed child of `direct`.
struct World {
    server: TestServer,
    ids: BTreeMap<&'static str, String>,
    clients: BTreeMap<&'static str, Client>,
}

impl World {
    async fn start(adjust: impl FnOnce(&mut troupe_session_svc::Config)) -> World {
        let server = TestServer::start_with(adjust).await;
        let mut ids = BTreeMap::new();
        let mut clients = BTreeMap::new();
        for (name, ws, trust) in [
            ("direct", "alpha", TrustLevel::Direct),
            ("sandboxed", "alpha", TrustLevel::Sandboxed),
            ("direct2", "alpha", TrustLevel::Direct),
            ("sandboxed2", "alpha", TrustLevel::Sandboxed),
            ("beta_direct", "beta", TrustLevel::Direct),
            ("beta_sandboxed", "beta", TrustLevel::Sandboxed),
        ] {
            let (session, client, _) = server.root(ws, trust).await;
            ids.insert(name, session.session_id);
            clients.insert(name, client);
        }
        let mut direct = clients["direct"].clone();
        let kid = create_child(
            &mut direct,
            pb::CreateSessionRequest {
                trust_level: TrustLevel::Sandboxed as i32,
                ..child("child")
            },
        )
        .await;
        clients.insert("child", server.act_as(&kid.session_id).await);
        ids.insert("child", kid.session_id);
        World {
            server,
            ids,
            clients,
        }
    }

    fn client(&self, name: &str) -> Client {
        self.clients[name].clone()
    }

    fn name_of(&self, id: &str) -> &'static str {
        self.ids
            .iter()
            .find(|(_, v)| *v == id)
            .map(|(k, _)| *k)
            .unwrap_or_else(|| panic!("unknown session {id}"))
    }

    /// Every session's inbox count.
    async fn inboxes(&self) -> BTreeMap<&'static str, u64> {
        let mut out = BTreeMap::new();
        for (name, id) in &self.ids {
            out.insert(*name, self.server.get(id).await.inbox_count);
        }
        out
    }

    /// The sessions whose inbox grew since `before`, each by exactly one.
    async fn grown_once(&self, before: &BTreeMap<&'static str, u64>) -> Vec<&'static str> {
        let after = self.inboxes().await;
        let mut grown = Vec::new();
        for (name, n) in after {
            match n - before[name] {
                0 => {}
                1 => grown.push(name),
                more => panic!("{name} received {more} messages"),
            }
        }
        grown
    }

    /// The names of the recipients an answer lists with `outcome`.
    fn names(&self, recipients: &[pb::Recipient], outcome: pb::RecipientOutcome) -> Vec<&str> {
        let mut names: Vec<&str> = recipients
            .iter()
            .filter(|r| r.outcome == outcome as i32)
            .map(|r| self.name_of(&r.session_id))
            .collect();
        names.sort_unstable();
        names
    }
}

fn broadcast(text: &str, scope: pb::BroadcastScope) -> pb::BroadcastRequest {
    pb::BroadcastRequest {
        message: text.to_owned(),
        scope: scope as i32,
        ..Default::default()
    }
}

fn post(group: &str, text: &str) -> pb::PostToGroupRequest {
    pb::PostToGroupRequest {
        group: group.to_owned(),
        message: text.to_owned(),
        request_id: String::new(),
    }
}

const DELIVERED: pb::RecipientOutcome = pb::RecipientOutcome::Delivered;
const ENDED: pb::RecipientOutcome = pb::RecipientOutcome::Ended;

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
        .create_group(pb::CreateGroupRequest {
            name: "team".to_owned(),
        })
        .await
        .expect("create")
        .into_inner();
    assert_eq!(
        created.group.expect("group").member_ids,
        [w.ids["direct"].clone()]
    );
    let members: Vec<String> = ["sandboxed", "direct2", "sandboxed2", "child"]
        .iter()
        .map(|n| w.ids[n].clone())
        .collect();
    direct
        .add_group_members(pb::AddGroupMembersRequest {
            group: "team".to_owned(),
            session_ids: members.clone(),
        })
        .await
        .expect("add");

    // (poster, recipients): the poster's may_message over the other members.
    let cases: &[(&str, &[&str])] = &[
        ("direct", &["child", "direct2", "sandboxed", "sandboxed2"]),
        ("direct2", &["child", "direct", "sandboxed", "sandboxed2"]),
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
        let groups = w
            .client(member)
            .list_groups(pb::ListGroupsRequest::default())
            .await
            .expect("list")
            .into_inner()
            .groups;
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
async fn members_are_added_only_if_the_adder_may_message_them() {
    let w = World::start(|_| {}).await;
    let mut sandboxed = w.client("sandboxed");
    sandboxed
        .create_group(pb::CreateGroupRequest {
            name: "low".to_owned(),
        })
        .await
        .expect("create");
    for target in ["direct", "beta_sandboxed", "beta_direct"] {
        let refused = sandboxed
            .add_group_members(pb::AddGroupMembersRequest {
                group: "low".to_owned(),
                session_ids: vec![w.ids["sandboxed2"].clone(), w.ids[target].clone()],
            })
            .await
            .expect_err(target);
        assert_eq!(refused.code(), Code::NotFound, "{target}: {refused:?}");
    }
    // None of a refused call's members were added.
    let group = sandboxed
        .list_groups(pb::ListGroupsRequest::default())
        .await
        .expect("list")
        .into_inner()
        .groups
        .remove(0);
    assert_eq!(group.member_ids, [w.ids["sandboxed"].clone()]);

    // A non-member may not add, and a name is the first creator's.
    let not_member = w
        .client("direct")
        .add_group_members(pb::AddGroupMembersRequest {
            group: "low".to_owned(),
            session_ids: vec![w.ids["direct"].clone()],
        })
        .await
        .expect_err("not a member");
    assert_eq!(reason(&not_member), "GROUP_NOT_FOUND");
    let taken = w
        .client("direct")
        .create_group(pb::CreateGroupRequest {
            name: "low".to_owned(),
        })
        .await
        .expect_err("taken");
    assert_eq!(
        (taken.code(), reason(&taken).as_str()),
        (Code::AlreadyExists, "GROUP_EXISTS")
    );
    let again = sandboxed
        .create_group(pb::CreateGroupRequest {
            name: "low".to_owned(),
        })
        .await
        .expect("the creator's retry answers its group");
    assert_eq!(again.into_inner().group.expect("group").name, "low");
    // Another workspace may use the name.
    w.client("beta_sandboxed")
        .create_group(pb::CreateGroupRequest {
            name: "low".to_owned(),
        })
        .await
        .expect("another workspace's own");
    let refused = w
        .client("direct")
        .create_group(pb::CreateGroupRequest {
            name: "../x".to_owned(),
        })
        .await
        .expect_err("bad name");
    assert_eq!(refused.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn ended_members_are_reported_and_the_rest_still_receive() {
    let w = World::start(|_| {}).await;
    let mut direct = w.client("direct");
    direct
        .create_group(pb::CreateGroupRequest {
            name: "crew".to_owned(),
        })
        .await
        .expect("create");
    direct
        .add_group_members(pb::AddGroupMembersRequest {
            group: "crew".to_owned(),
            session_ids: vec![w.ids["sandboxed"].clone(), w.ids["direct2"].clone()],
        })
        .await
        .expect("add");
    w.server
        .operator()
        .await
        .terminate_session(terminate(w.ids["direct2"].clone()))
        .await
        .expect("terminate");
    let before = w.inboxes().await;
    let answer = direct
        .post_to_group(post("crew", "still there?"))
        .await
        .expect("post")
        .into_inner();
    assert_eq!(w.names(&answer.recipients, DELIVERED), ["sandboxed"]);
    assert_eq!(w.names(&answer.recipients, ENDED), ["direct2"]);
    assert_eq!(w.grown_once(&before).await, ["sandboxed"]);
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
async fn fan_out_over_the_cap_is_refused_before_anything_is_stored() {
    let w = World::start(|c| c.messaging.max_fan_out = 3).await;
    let before = w.inboxes().await;
    let refused = w
        .client("direct")
        .broadcast(broadcast("too many", pb::BroadcastScope::Workspace))
        .await
        .expect_err("four recipients, cap three");
    assert_eq!(
        (refused.code(), reason(&refused).as_str()),
        (Code::ResourceExhausted, "FAN_OUT_EXCEEDED"),
        "{refused:?}"
    );
    assert!(w.grown_once(&before).await.is_empty());
    // Three are fine; a group grows to the cap plus its poster, no more.
    w.client("sandboxed")
        .broadcast(broadcast("two", pb::BroadcastScope::Workspace))
        .await
        .expect("within the cap");
    let mut direct = w.client("direct");
    direct
        .create_group(pb::CreateGroupRequest {
            name: "big".to_owned(),
        })
        .await
        .expect("create");
    let add = |names: &[&str]| pb::AddGroupMembersRequest {
        group: "big".to_owned(),
        session_ids: names.iter().map(|n| w.ids[n].clone()).collect(),
    };
    direct
        .add_group_members(add(&["sandboxed", "direct2", "sandboxed2"]))
        .await
        .expect("cap plus the poster");
    let full = direct
        .add_group_members(add(&["child"]))
        .await
        .expect_err("past the cap");
    assert_eq!(reason(&full), "FAN_OUT_EXCEEDED");
}

#[tokio::test]
async fn every_message_counts_against_one_rate_and_a_refused_broadcast_stores_nothing() {
    // One message every two seconds, three at once.
    let w = World::start(|c| {
        c.messaging.message_rate_per_sec = 0.5;
        c.messaging.message_burst = 3;
    })
    .await;
    // A reply to the parent counts, then a broadcast counts each recipient
    // (the child reaches sandboxed and sandboxed2): three in all.
    let mut kid = w.client("child");
    kid.reply_to_parent(pb::ReplyToParentRequest {
        message: "one".to_owned(),
        request_id: String::new(),
    })
    .await
    .expect("first of three");
    let before = w.inboxes().await;
    kid.broadcast(broadcast("two more", pb::BroadcastScope::Workspace))
        .await
        .expect("second and third");
    assert_eq!(w.grown_once(&before).await, ["sandboxed", "sandboxed2"]);
    let limited = kid
        .send_message(message(w.ids["sandboxed"].clone(), "fourth"))
        .await
        .expect_err("past the burst");
    assert_eq!(
        (limited.code(), reason(&limited).as_str()),
        (Code::ResourceExhausted, "RATE_LIMITED"),
        "{limited:?}"
    );

    // Another sender's rate is its own: a message, then a broadcast to two
    // that would need four in all is refused whole, nothing stored.
    let mut sandboxed = w.client("sandboxed");
    sandboxed
        .send_message(message(w.ids["sandboxed2"].clone(), "one"))
        .await
        .expect("its own first");
    sandboxed
        .send_message(message(w.ids["sandboxed2"].clone(), "two"))
        .await
        .expect("its own second");
    let before = w.inboxes().await;
    let refused = sandboxed
        .broadcast(broadcast("to two", pb::BroadcastScope::Workspace))
        .await
        .expect_err("two recipients, one left");
    assert_eq!(reason(&refused), "RATE_LIMITED", "{refused:?}");
    assert!(w.grown_once(&before).await.is_empty(), "nothing stored");

    // More recipients than the burst are never allowed at once.
    let whole = w
        .client("direct")
        .broadcast(broadcast("four", pb::BroadcastScope::Workspace))
        .await
        .expect_err("four recipients, burst three");
    assert_eq!(reason(&whole), "RATE_LIMITED", "{whole:?}");
}

#[tokio::test]
async fn a_retried_broadcast_replays_its_answer_and_stores_nothing_more() {
    let w = World::start(|_| {}).await;
    let request = pb::BroadcastRequest {
        request_id: "once".to_owned(),
        ..broadcast("exactly once", pb::BroadcastScope::Workspace)
    };
    let mut direct = w.client("direct");
    let before = w.inboxes().await;
    let first = direct
        .broadcast(request.clone())
        .await
        .expect("first")
        .into_inner();
    let second = direct
        .broadcast(request.clone())
        .await
        .expect("retry")
        .into_inner();
    assert_eq!(first, second, "the retry answers the first call's answer");
    assert_eq!(w.grown_once(&before).await.len(), 4, "each recipient once");
    let conflict = direct
        .broadcast(pb::BroadcastRequest {
            message: "something else".to_owned(),
            ..request
        })
        .await
        .expect_err("same id, other message");
    assert_eq!(reason(&conflict), "IDEMPOTENCY_CONFLICT");

    // One allowed audit entry, naming each recipient and its message.
    let entries = w
        .server
        .operator()
        .await
        .list_audit(pb::ListAuditRequest {
            session_id: w.ids["direct"].clone(),
            ..Default::default()
        })
        .await
        .expect("audit")
        .into_inner()
        .entries;
    let broadcasts: Vec<_> = entries
        .iter()
        .filter(|e| e.action == "broadcast" && e.allowed)
        .collect();
    assert_eq!(broadcasts.len(), 1, "{entries:?}");
    for r in &first.recipients {
        assert!(
            broadcasts[0].detail.contains(&r.message_id),
            "{broadcasts:?}"
        );
    }
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
        .create_group(pb::CreateGroupRequest {
            name: "ops".to_owned(),
        })
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
        .create_group(pb::CreateGroupRequest {
            name: "seen".to_owned(),
        })
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
