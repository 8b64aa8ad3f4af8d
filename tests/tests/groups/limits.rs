//! How much a message to many may do: the fan-out cap, the message rate
//! (under concurrency too), and a retry's replay.

use tonic::Code;
use troupe_proto::session as pb;
use troupe_tests::{message, reason};

use super::{World, broadcast, groups_of, new_group, post};

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
    direct.create_group(new_group("big")).await.expect("create");
    let add = |names: &[&str]| w.members("big", names);
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

/// A sandboxed member's adds are bounded on the members it may see, so no
/// answer nor refusal counts the direct members it cannot: before, its add
/// was refused "this would make it 5" with one member in its view. A post
/// stays bounded on the members it reaches.
#[tokio::test]
async fn a_group_refusal_counts_only_what_the_adder_sees() {
    let w = World::start(|c| c.messaging.max_fan_out = 3).await;
    let mut direct = w.client("direct");
    direct
        .create_group(new_group("mixed"))
        .await
        .expect("create");
    let add = |names: &[&str]| w.members("mixed", names);
    direct
        .add_group_members(add(&["direct2", "sandboxed"]))
        .await
        .expect("three members");
    let seen = w
        .client("sandboxed")
        .add_group_members(add(&["sandboxed2", "child"]))
        .await
        .expect("three members in the sandboxed member's view, the cap is four")
        .into_inner()
        .group
        .expect("group");
    let mut names: Vec<&str> = seen.member_ids.iter().map(|id| w.name_of(id)).collect();
    names.sort();
    assert_eq!(names, ["child", "sandboxed", "sandboxed2"]);

    // The direct member sees five: its add of a sixth is refused, without
    // a count...
    let (extra, _, _) = w
        .server
        .root("alpha", troupe_proto::session::TrustLevel::Direct)
        .await;
    let refused = direct
        .add_group_members(pb::AddGroupMembersRequest {
            group: "mixed".to_owned(),
            session_ids: vec![extra.session_id],
        })
        .await
        .expect_err("past the cap in the direct member's view");
    assert_eq!(reason(&refused), "FAN_OUT_EXCEEDED", "{refused:?}");
    assert!(!refused.message().contains('6'), "{refused:?}");
    // ...and a post stays bounded on whom it reaches: a direct member's
    // reaches the other direct member only (a sandboxed member never
    // receives a direct member's post).
    let reached = direct
        .post_to_group(post("mixed", "all of you"))
        .await
        .expect("one recipient")
        .into_inner()
        .recipients;
    let names: Vec<&str> = reached.iter().map(|r| w.name_of(&r.session_id)).collect();
    assert_eq!(names, ["direct2"]);
    // The sandboxed member's post reaches the two it may message.
    w.client("sandboxed")
        .post_to_group(post("mixed", "sandboxed only"))
        .await
        .expect("two recipients");
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
async fn concurrent_messages_of_one_session_never_pass_its_burst() {
    // A rate that does not refill during the test: the burst is all there is.
    let w = World::start(|c| {
        c.messaging.message_rate_per_sec = 0.001;
        c.messaging.message_burst = 5;
    })
    .await;
    // On PostgreSQL, half the calls go through a replica on the same database.
    let replica = match troupe_tests::postgres::Backend::from_env() {
        troupe_tests::postgres::Backend::Postgres => Some(w.server.replica().await),
        troupe_tests::postgres::Backend::Sqlite => None,
    };
    let token = w.server.token_for(&w.ids["sandboxed"]).await;
    let other = match &replica {
        Some(r) => r.client(Some(&token)).await,
        None => w.client("sandboxed"),
    };
    let before = w.inboxes().await;
    let calls = (0..12).map(|i| {
        let mut client = if i % 2 == 0 {
            w.client("sandboxed")
        } else {
            other.clone()
        };
        let to = w.ids["sandboxed2"].clone();
        async move {
            if i % 3 == 0 {
                // A broadcast from sandboxed reaches child and sandboxed2: two.
                client
                    .broadcast(broadcast("many", pb::BroadcastScope::Workspace))
                    .await
                    .map(|a| a.into_inner().recipients.len())
            } else {
                client.send_message(message(to, "one")).await.map(|_| 1)
            }
        }
    });
    let results = futures::future::join_all(calls).await;
    let sent: usize = results.iter().filter_map(|r| r.as_ref().ok()).sum();
    for refused in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(reason(refused), "RATE_LIMITED", "{refused:?}");
    }
    assert!(
        (4..=5).contains(&sent),
        "{sent} messages passed a burst of 5"
    );
    let after = w.inboxes().await;
    let stored = after["sandboxed2"] - before["sandboxed2"] + after["child"] - before["child"];
    assert_eq!(
        stored as usize, sent,
        "what was answered is what was stored"
    );
    if let Some(r) = replica {
        r.stop().await;
    }
}

#[tokio::test]
async fn concurrent_additions_never_grow_a_group_past_its_size() {
    // A group holds the fan-out limit (2) plus its poster: three.
    let w = World::start(|c| c.messaging.max_fan_out = 2).await;
    let replica = match troupe_tests::postgres::Backend::from_env() {
        troupe_tests::postgres::Backend::Postgres => Some(w.server.replica().await),
        troupe_tests::postgres::Backend::Sqlite => None,
    };
    let mut creator = w.client("direct");
    creator
        .create_group(new_group("tight"))
        .await
        .expect("create");
    let token = w.server.token_for(&w.ids["direct"]).await;
    let other = match &replica {
        Some(r) => r.client(Some(&token)).await,
        None => creator.clone(),
    };
    let adds = ["sandboxed", "direct2", "sandboxed2", "child"]
        .into_iter()
        .enumerate()
        .map(|(i, name)| {
            let mut client = if i % 2 == 0 {
                creator.clone()
            } else {
                other.clone()
            };
            let request = w.members("tight", &[name]);
            async move { client.add_group_members(request).await }
        });
    let results = futures::future::join_all(adds).await;
    let added = results.iter().filter(|r| r.is_ok()).count();
    for refused in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(reason(refused), "FAN_OUT_EXCEEDED", "{refused:?}");
    }
    assert_eq!(added, 2, "{results:?}");
    let group = groups_of(&mut creator).await.remove(0);
    assert_eq!(group.member_ids.len(), 3, "{group:?}");
    if let Some(r) = replica {
        r.stop().await;
    }
}
