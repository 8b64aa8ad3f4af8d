//! Messages the session service refuses, through the real bridge driven by
//! the MCP Python SDK: a broadcast past the fan-out limit or the message
//! rate, a message to a full inbox, a reply to a parent that has ended. Each
//! arrives as a tool error naming its reason and what to do, and nothing is
//! stored; a broadcast leaves a full inbox out and says so.

use crate::common;

use common::*;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use troupe_proto::session::{SessionStatus, TrustLevel};
use troupe_tests::{TestServer, child, create_child, terminate};

/// The messaging limit a case's server is given.
#[derive(Clone, Copy)]
enum Limit {
    FanOut(u32),
    /// A burst of `n` messages, one more per second.
    Burst(u32),
    UnreadBytes(u64),
}

/// A root with two children, on a server with `limit`.
async fn team(limit: Limit) -> (TestServer, String, [String; 2]) {
    let server = TestServer::start_with(|c| match limit {
        Limit::FanOut(n) => c.messaging.max_fan_out = n,
        Limit::Burst(n) => {
            c.messaging.message_rate_per_sec = 1.0;
            c.messaging.message_burst = n;
        }
        Limit::UnreadBytes(n) => c.messaging.max_unread_bytes = n,
    })
    .await;
    let (_, mut as_root, token) = server.root("ws", TrustLevel::Direct).await;
    let a = create_child(&mut as_root, child("a")).await.session_id;
    let b = create_child(&mut as_root, child("b")).await.session_id;
    (server, token, [a, b])
}

/// Checks that `message` (made for the two children) is refused as
/// `reason`, with advice saying `words`, and that no inbox got it.
async fn check(
    limit: Limit,
    message: fn(&[String; 2]) -> Value,
    reason: &'static str,
    words: &'static str,
) {
    let (server, token, kids) = team(limit).await;
    let out = drive(vec![stdio(
        &unix_endpoint(&server),
        &token,
        vec![message(&kids)],
    )])
    .await;
    let result = &out[0]["results"][0];
    refused(result, reason);
    let advice = advice(result);
    assert!(advice.contains(words), "{reason}: {advice}");
    for kid in &kids {
        assert_eq!(
            inbox_count(&server, kid).await,
            1,
            "{reason}: nothing stored"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_past_a_limit_is_refused_and_stored_nowhere() {
    let to_children: fn(&[String; 2]) -> Value =
        |_| call("broadcast", json!({"message": "all", "scope": "children"}));
    let mut cases = JoinSet::new();
    cases.spawn(check(
        Limit::FanOut(1),
        to_children,
        "FAN_OUT_EXCEEDED",
        "broadcast to a narrower scope",
    ));
    cases.spawn(check(
        Limit::Burst(1),
        to_children,
        "RATE_LIMITED",
        "send to fewer at once",
    ));
    cases.spawn(check(
        Limit::UnreadBytes(64),
        |kids| {
            call(
                "send_message",
                json!({"session_id": kids[0], "message": "x".repeat(100)}),
            )
        },
        "INBOX_FULL",
        "wait until it has read its messages",
    ));
    while let Some(done) = cases.join_next().await {
        if let Err(failed) = done {
            std::panic::resume_unwind(failed.into_panic());
        }
    }
}

#[tokio::test]
async fn a_broadcast_leaves_a_full_inbox_out_and_says_so() {
    let (server, token, [a, b]) = team(Limit::UnreadBytes(64)).await;
    // a's inbox is nearly full; b's takes the message.
    let out = drive(vec![stdio(
        &unix_endpoint(&server),
        &token,
        vec![
            call(
                "send_message",
                json!({"session_id": a, "message": "y".repeat(50)}),
            ),
            call(
                "broadcast",
                json!({"message": "z".repeat(20), "scope": "children"}),
            ),
        ],
    )])
    .await;
    ok(&out[0]["results"][0]);
    let answer = ok(&out[0]["results"][1]);
    assert_eq!(answer["delivered"], 1, "{answer}");
    let recipients = answer["recipients"].as_array().expect("recipients");
    let of = |id: &str| {
        recipients
            .iter()
            .find(|r| r["session_id"] == id)
            .unwrap_or_else(|| panic!("{id} in {answer}"))
    };
    assert_eq!(of(&a)["outcome"], "inbox_full", "{answer}");
    assert!(
        of(&a)["note"].as_str().unwrap().contains("nothing stored"),
        "{answer}"
    );
    assert_eq!(of(&b)["outcome"], "delivered", "{answer}");
    assert_eq!(of(&b)["delivery"], "queued", "{answer}");
    assert_eq!(
        inbox_count(&server, &a).await,
        2,
        "the initial message and the send"
    );
    assert_eq!(
        inbox_count(&server, &b).await,
        2,
        "the initial message and the broadcast"
    );
}

#[tokio::test]
async fn a_reply_to_a_parent_that_has_ended_is_refused() {
    let server = TestServer::start().await;
    let endpoint = unix_endpoint(&server);
    let (root, _, root_token) = server.root("ws", TrustLevel::Direct).await;
    let out = drive(vec![stdio(
        &endpoint,
        &root_token,
        vec![
            create("kept", json!({"on_parent_end": "abandon"})),
            create("ended with it", json!({"on_parent_end": "terminate"})),
        ],
    )])
    .await;
    let kept = created_id(&out[0]["results"][0]);
    let ended = created_id(&out[0]["results"][1]);
    server
        .operator()
        .await
        .terminate_session(terminate(root.session_id.as_str()))
        .await
        .expect("terminate the root");
    let status = |id: String| {
        let server = &server;
        async move { server.get(&id).await.session.expect("session").status() }
    };
    assert_eq!(status(kept.clone()).await, SessionStatus::Pending);
    assert_eq!(status(ended).await, SessionStatus::Terminated);

    let token = server.token_for(&kept).await;
    let out = drive(vec![stdio(
        &endpoint,
        &token,
        vec![call("reply_to_parent", json!({"message": "done?"}))],
    )])
    .await;
    let result = &out[0]["results"][0];
    refused(result, "PARENT_NOT_RUNNING");
    let advice = advice(result);
    assert!(advice.contains("takes no reply"), "{advice}");
    assert_eq!(
        inbox_count(&server, &root.session_id).await,
        1,
        "only its start"
    );
}
