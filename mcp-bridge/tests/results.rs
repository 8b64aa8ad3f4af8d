//! A child's `finish` and `reply_to_parent` through the real bridge, driven
//! by the official MCP Python SDK: a sandboxed child of a direct parent
//! talks to its parent and hands it its result, naming no session; the
//! parent's `wait_for_session` and `get_session` show the result.

use crate::common;

use common::*;
use serde_json::json;
use troupe_proto::session::{
    CreateSessionRequest, EventKind, Finished, Outcome, TrustLevel, WatchSessionsRequest,
    session_event::Detail,
};
use troupe_tests::TestServer;

#[tokio::test]
async fn a_sandboxed_child_finishes_for_its_direct_parent_through_the_bridge() {
    let server = TestServer::start_with(|c| c.max_result_bytes = 32).await;
    let endpoint = unix_endpoint(&server);
    let (root, mut as_root, root_token) = server.root("ws", TrustLevel::Direct).await;
    let create = |title: &str| CreateSessionRequest {
        title: title.into(),
        agent_name: "worker".into(),
        initial_message: "work".into(),
        trust_level: TrustLevel::Sandboxed as i32,
        ..Default::default()
    };
    let child = as_root
        .create_session(create("child"))
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    let sibling = as_root
        .create_session(create("sibling"))
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    let child_token = server.token_for(&child.session_id).await;

    // The parent waits for its child, in its own bridge, meanwhile.
    let waiting = spawn_client(vec![stdio(
        &endpoint,
        &root_token,
        vec![call(
            "wait_for_session",
            json!({"session_id": child.session_id, "timeout_s": 50}),
        )],
    )])
    .await;
    let before = inbox_count(&server, &root.session_id).await;
    let out = drive(vec![
        stdio(
            &endpoint,
            &child_token,
            vec![
                call("get_session", json!({"session_id": child.session_id})),
                call("reply_to_parent", json!({"message": "halfway there"})),
                call("finish", json!({"result": "x".repeat(33)})),
                call(
                    "finish",
                    json!({"result": "the answer is 42", "outcome": "success"}),
                ),
                call("finish", json!({"result": "again"})),
            ],
        ),
        stdio(
            &endpoint,
            &root_token,
            vec![call("reply_to_parent", json!({"message": "anyone?"}))],
        ),
    ])
    .await;
    let child_calls = &out[0]["results"];
    // It never learns its direct parent's id, from any answer.
    let own = ok(&child_calls[0]);
    assert_eq!(own["session"]["parent_session_id"], json!(null), "{own}");
    assert!(!out[0].to_string().contains(&root.session_id), "{}", out[0]);
    let replied = ok(&child_calls[1]);
    assert_eq!(replied["sequence"], before + 1, "{replied}");
    let text = refused(&child_calls[2], "INVALID_ARGUMENT");
    assert!(text.contains("limit of 32 bytes"), "{text}");
    let finished = ok(&child_calls[3]);
    assert_eq!(finished["session"]["status"], "completed", "{finished}");
    assert_eq!(finished["session"]["end_reason"], "finished", "{finished}");
    refused(&child_calls[4], "SESSION_ENDED");
    // A root has no parent.
    refused(&out[1]["results"][0], "NO_PARENT");

    // The reply reached the parent once, and no one else.
    assert_eq!(inbox_count(&server, &root.session_id).await, before + 1);
    assert_eq!(inbox_count(&server, &sibling.session_id).await, 1);
    assert_eq!(inbox_count(&server, &child.session_id).await, 1);

    let waited = finish_client(waiting).await;
    let waited = ok(&waited[0]["results"][0]);
    assert_eq!(waited["timed_out"], false, "{waited}");
    assert_eq!(
        waited["result"]["finished"],
        json!({"outcome": "success", "result": "the answer is 42"}),
        "{waited}"
    );
    let got = drive(vec![stdio(
        &endpoint,
        &root_token,
        vec![call("get_session", json!({"session_id": child.session_id}))],
    )])
    .await;
    let got = ok(&got[0]["results"][0]);
    assert_eq!(got["result"]["finished"]["result"], "the answer is 42");
    assert_eq!(got["result"]["status"], "completed");

    // On the watch stream, the end event carries the result.
    let mut events = as_root
        .watch_sessions(WatchSessionsRequest {
            session_id: child.session_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let end = loop {
        let event = tokio::time::timeout(std::time::Duration::from_secs(30), events.message())
            .await
            .expect("the end event within 30 s")
            .unwrap()
            .expect("the stream goes on");
        if event.kind() == EventKind::Completed {
            break event;
        }
    };
    assert_eq!(
        end.detail,
        Some(Detail::Finished(Finished {
            outcome: Outcome::Success as i32,
            result: "the answer is 42".into(),
        }))
    );
}
