//! Messages against a sender that writes as many bytes as it may, on either
//! backend (`TROUPE_TEST_BACKEND`): every byte a session stores in another's
//! inbox counts against its byte rate (a broadcast's body once per
//! recipient), an inbox holds a bounded number of unread bytes (a message
//! past it refused, a broadcast leaving that recipient out), a broadcast's
//! body is stored once however many inboxes hold it, and a delivery frees
//! what it delivered.

use tonic::Code;
use troupe_proto::session::{self as pb, TrustLevel};
use troupe_session_svc::{
    MessageLimits,
    error::SessionError,
    model::{Action, NewMessage, Principal, SessionId, Trust},
    policy,
    store::{Bounds, Fence, Holder, prelude::*},
};
use troupe_tests::{
    TestServer, message, reason,
    stores::{self, new_session, operator_audit},
};

/// The largest message the service takes.
const LARGEST: usize = 256 * 1024;

/// A server with the message rates off and `adjust`ed message limits.
async fn server(adjust: impl FnOnce(&mut MessageLimits)) -> TestServer {
    TestServer::start_with(|c| {
        c.messaging.message_rate_per_sec = 0.0;
        c.messaging.message_bytes_per_sec = 0;
        adjust(&mut c.messaging);
    })
    .await
}

fn broadcast(text: String) -> pb::BroadcastRequest {
    pb::BroadcastRequest {
        message: text,
        scope: pb::BroadcastScope::Workspace as i32,
        request_id: String::new(),
        workspace_id: String::new(),
    }
}

/// Each recipient's outcome, by session id.
fn outcomes(answer: &pb::BroadcastResponse) -> Vec<(String, pb::RecipientOutcome)> {
    let mut all: Vec<_> = answer
        .recipients
        .iter()
        .map(|r| (r.session_id.clone(), r.outcome()))
        .collect();
    all.sort();
    all
}

/// Messages stored in all, as inbox entries.
async fn entries(server: &TestServer) -> i64 {
    server.stored_number("SELECT COUNT(*) FROM messages").await
}

#[tokio::test]
async fn a_full_inbox_refuses_a_message_and_a_broadcast_leaves_it_out() {
    let server = server(|m| m.max_unread_bytes = LARGEST as u64).await;
    let (_, mut sender, _) = server.root("alpha", TrustLevel::Direct).await;
    let (full, _, _) = server.root("alpha", TrustLevel::Direct).await;
    let (other, _, _) = server.root("alpha", TrustLevel::Direct).await;

    // The root's initial message ("start", 5 bytes) is unread: what fits
    // is the rest.
    let fits = "x".repeat(LARGEST - 5);
    sender
        .send_message(message(&full.session_id, fits))
        .await
        .expect("up to the limit");
    let before = entries(&server).await;
    let refused = sender
        .send_message(message(&full.session_id, "one byte more"))
        .await
        .expect_err("past the limit");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(reason(&refused), "INBOX_FULL");
    assert!(
        !refused.message().contains(&(LARGEST - 5).to_string()),
        "the refusal names the limit, not what the inbox holds: {}",
        refused.message()
    );
    // The operator's messages are bounded by the inbox too.
    let operator = server
        .operator()
        .await
        .send_message(message(&full.session_id, "from the operator"))
        .await
        .expect_err("the operator past the limit");
    assert_eq!(reason(&operator), "INBOX_FULL");
    assert_eq!(entries(&server).await, before, "nothing stored");

    let answer = sender
        .broadcast(broadcast("to everyone".into()))
        .await
        .expect("a broadcast")
        .into_inner();
    let mut expected = vec![
        (full.session_id.clone(), pb::RecipientOutcome::InboxFull),
        (other.session_id.clone(), pb::RecipientOutcome::Delivered),
    ];
    expected.sort();
    assert_eq!(outcomes(&answer), expected);
    assert_eq!(entries(&server).await, before + 1, "the other's only");
}

#[tokio::test]
async fn bytes_count_once_per_recipient_against_the_senders_byte_rate() {
    // 256 KiB in a burst, then 1 KiB a second.
    let server = server(|m| {
        m.message_bytes_per_sec = 1024;
        m.message_bytes_burst = LARGEST as u64;
    })
    .await;
    let (_, mut sender, _) = server.root("alpha", TrustLevel::Direct).await;
    let mut others = Vec::new();
    for _ in 0..3 {
        others.push(server.root("alpha", TrustLevel::Direct).await.0);
    }
    let body = "y".repeat(100 * 1024);

    // To three at once: 300 KiB, more than a whole burst: never allowed.
    let before = entries(&server).await;
    let refused = sender
        .broadcast(broadcast(body.clone()))
        .await
        .expect_err("more bytes at once than the burst");
    assert_eq!(reason(&refused), "RATE_LIMITED", "{refused:?}");
    assert!(refused.message().contains("bytes"), "{}", refused.message());
    assert_eq!(entries(&server).await, before, "all or nothing");

    // To two: 200 KiB of the 256; a third 100 KiB waits.
    sender
        .send_message(message(&others[0].session_id, body.clone()))
        .await
        .expect("100 KiB");
    sender
        .send_message(message(&others[1].session_id, body.clone()))
        .await
        .expect("200 KiB");
    let waits = sender
        .send_message(message(&others[2].session_id, body.clone()))
        .await
        .expect_err("300 KiB within a burst's time");
    assert_eq!(reason(&waits), "RATE_LIMITED", "{waits:?}");
    assert!(
        troupe_tests::error_metadata(&waits, "retry_after_ms").is_some(),
        "it says when: {waits:?}"
    );
    assert_eq!(entries(&server).await, before + 2);
}

#[tokio::test]
async fn a_broadcast_body_is_stored_once_however_many_inboxes_hold_it() {
    let server = server(|_| {}).await;
    let (_, mut sender, _) = server.root("alpha", TrustLevel::Direct).await;
    for _ in 0..8 {
        server.root("alpha", TrustLevel::Direct).await;
    }
    let bodies = "SELECT CAST(COALESCE(SUM(LENGTH(body)), 0) AS BIGINT) FROM message_bodies";
    let before = server.stored_number(bodies).await;
    let body = "z".repeat(64 * 1024);
    let answer = sender
        .broadcast(broadcast(body.clone()))
        .await
        .expect("a broadcast")
        .into_inner();
    let delivered = answer
        .recipients
        .iter()
        .filter(|r| r.outcome() == pb::RecipientOutcome::Delivered)
        .count();
    assert_eq!(delivered, 8);
    assert_eq!(
        server.stored_number(bodies).await - before,
        body.len() as i64,
        "one body for eight inboxes"
    );
    let inline = "SELECT CAST(COALESCE(SUM(LENGTH(body)), 0) AS BIGINT) FROM messages";
    assert_eq!(
        server.stored_number(inline).await,
        0,
        "no entry holds a body"
    );
    let unread = "SELECT CAST(SUM(unread_bytes) AS BIGINT) FROM sessions";
    // Eight copies counted unread, and the nine roots' "start".
    assert_eq!(
        server.stored_number(unread).await,
        8 * body.len() as i64 + 9 * 5
    );
}

/// The inbox bound of the service's defaults but `max_unread_bytes`.
fn inbox_of(max_unread_bytes: u64) -> MessageLimits {
    MessageLimits {
        max_unread_bytes,
        ..MessageLimits::default()
    }
}

/// A delivery frees what it delivered: a full inbox takes messages again.
async fn delivery_frees_the_inbox(store: impl Store) {
    let fence: Fence = store
        .acquire_lease(&Holder::generate(), std::time::Duration::from_secs(3600))
        .await
        .expect("lease")
        .expect("lease free");
    let root = new_session("inbox", Trust::Direct);
    store
        .create_root(
            root,
            None,
            operator_audit(Action::CreateRootSession, "inbox"),
            &|_| Ok(Default::default()),
        )
        .await
        .expect("root");
    let limits = inbox_of(300);
    let inbox = |unread: u64, bytes: u64| policy::admit_inbox(unread, bytes, &limits);
    let bounds = Bounds {
        throttle: None,
        inbox: &inbox,
    };
    let send = |n: usize| NewMessage {
        message_id: format!("msg_inbox_{n}"),
        sender: Principal::Operator,
        body: "m".repeat(200),
    };
    let recipient = SessionId::from("inbox");
    let sent = |n: usize| {
        store.send_message(
            &recipient,
            send(n),
            None,
            operator_audit(Action::SendMessage, "inbox"),
            bounds,
            &|_| Ok(()),
        )
    };
    let first = sent(1).await.expect("200 of 300 bytes");
    let full: Result<_, SessionError> = sent(2).await;
    assert_eq!(
        full.expect_err("400 of 300").reason(),
        troupe_session_svc::error::Reason::InboxFull
    );
    store
        .mark_delivered(&fence, &"inbox".into(), first.sequence)
        .await
        .expect("delivered");
    sent(3)
        .await
        .expect("room again once the first was delivered");
}

#[tokio::test]
async fn a_delivery_frees_the_inbox_on_sqlite() {
    let (_dir, store) = stores::sqlite().await;
    delivery_frees_the_inbox(store).await;
}

#[tokio::test]
async fn a_delivery_frees_the_inbox_on_postgres() {
    delivery_frees_the_inbox(stores::postgres().await).await;
}
