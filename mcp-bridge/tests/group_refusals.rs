//! Groups through the real bridge, driven by the MCP Python SDK, where they
//! go wrong: a name another session holds, a group that does not exist (or
//! that the caller is not in), a name that is no name; and a post whose
//! member has ended, which reaches the others and says so.

use crate::common;

use common::*;
use serde_json::json;
use troupe_proto::session::TrustLevel;
use troupe_tests::{TestServer, child, create_child};

#[tokio::test]
async fn group_calls_are_refused_by_name_and_change_nothing() {
    let server = TestServer::start().await;
    let endpoint = unix_endpoint(&server);
    let (root, mut as_root, root_token) = server.root("ws", TrustLevel::Direct).await;
    let kid = create_child(&mut as_root, child("kid")).await.session_id;
    let kid_token = server.token_for(&kid).await;
    let out = drive(vec![
        stdio(
            &endpoint,
            &root_token,
            vec![
                call("list_groups", json!({})),
                call("create_group", json!({"name": "team"})),
                call("create_group", json!({"name": "team"})),
                call("create_group", json!({"name": "no such name!"})),
            ],
        ),
        stdio(
            &endpoint,
            &kid_token,
            vec![
                call("create_group", json!({"name": "team"})),
                call(
                    "post_to_group",
                    json!({"group": "team", "message": "let me in"}),
                ),
                call(
                    "add_to_group",
                    json!({"group": "team", "session_ids": [kid]}),
                ),
                call(
                    "post_to_group",
                    json!({"group": "nowhere", "message": "hello?"}),
                ),
                call("list_groups", json!({})),
            ],
        ),
    ])
    .await;
    let (mine, theirs) = (&out[0]["results"], &out[1]["results"]);

    let none = ok(&mine[0]);
    assert_eq!(none, &json!({"count": 0, "groups": []}));
    let team = ok(&mine[1]);
    assert_eq!(team["name"], "team", "{team}");
    assert_eq!(team["member_ids"], json!([root.session_id]), "{team}");
    assert_eq!(ok(&mine[2]), team, "creating one's own again returns it");
    refused(&mine[3], "INVALID_ARGUMENT");
    let error = &mine[3]["structuredContent"]["error"];
    assert_eq!(error["source"], "session-service", "{error}");
    assert_eq!(error["metadata"]["field"], "name", "{error}");

    // Another session may neither take the name nor use a group it is not in.
    refused(&theirs[0], "GROUP_EXISTS");
    assert!(advice(&theirs[0]).contains("choose another name"));
    for (i, group) in [(1, "team"), (2, "team"), (3, "nowhere")] {
        let text = refused(&theirs[i], "GROUP_NOT_FOUND");
        assert!(text.contains(group), "{text}");
        assert!(advice(&theirs[i]).contains("create_group makes one"));
    }
    assert_eq!(ok(&theirs[4])["count"], 0);

    // The group is as the root made it, and no one got a message.
    let out = drive(vec![stdio(
        &endpoint,
        &root_token,
        vec![call("list_groups", json!({}))],
    )])
    .await;
    let listed = ok(&out[0]["results"][0]);
    assert_eq!(listed["groups"], json!([team]), "{listed}");
    assert_eq!(inbox_count(&server, &root.session_id).await, 1);
    assert_eq!(inbox_count(&server, &kid).await, 1);
}

#[tokio::test]
async fn a_post_reaches_the_members_still_active_and_names_the_ended_ones() {
    let server = TestServer::start().await;
    let endpoint = unix_endpoint(&server);
    let (_, mut as_root, root_token) = server.root("ws", TrustLevel::Direct).await;
    let stays = create_child(&mut as_root, child("stays")).await.session_id;
    let leaves = create_child(&mut as_root, child("leaves")).await.session_id;
    let out = drive(vec![stdio(
        &endpoint,
        &root_token,
        vec![
            call("create_group", json!({"name": "crew"})),
            call(
                "add_to_group",
                json!({"group": "crew", "session_ids": [stays, leaves]}),
            ),
            call("terminate_session", json!({"session_id": leaves})),
            call(
                "post_to_group",
                json!({"group": "crew", "message": "status?"}),
            ),
        ],
    )])
    .await;
    let results = &out[0]["results"];
    assert_eq!(ok(&results[2])["terminated_session_ids"], json!([leaves]));
    let posted = ok(&results[3]);
    assert_eq!(posted["delivered"], 1, "{posted}");
    let recipients = posted["recipients"].as_array().expect("recipients");
    assert_eq!(recipients.len(), 2, "{posted}");
    for recipient in recipients {
        let expected = if recipient["session_id"] == stays.as_str() {
            "delivered"
        } else {
            assert_eq!(recipient["session_id"], leaves.as_str(), "{posted}");
            assert!(recipient["note"].as_str().unwrap().contains("has ended"));
            "ended"
        };
        assert_eq!(recipient["outcome"], expected, "{posted}");
    }
    assert_eq!(inbox_count(&server, &stays).await, 2);
    assert_eq!(inbox_count(&server, &leaves).await, 1);
}
