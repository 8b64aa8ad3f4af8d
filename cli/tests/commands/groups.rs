//! The operator's group commands: a broadcast to a workspace, each
//! recipient once, and the groups its sessions keep.

use super::*;

/// `troupe group broadcast` and `troupe group list`: the operator's message
/// to a workspace, each recipient once, and the groups its sessions keep.
#[tokio::test]
async fn group_broadcast_reaches_each_active_session_once_and_list_shows_groups() {
    let server = TestServer::start().await;
    let data = tempfile::tempdir().expect("temp dir");
    let (a, mut as_a, _) = server.root("alpha", TrustLevel::Sandboxed).await;
    let (b, _, _) = server.root("alpha", TrustLevel::Direct).await;
    let (other, _, _) = server.root("beta", TrustLevel::Direct).await;
    as_a.create_group(troupe_proto::session::CreateGroupRequest {
        name: "pair".into(),
    })
    .await
    .expect("create group");

    let sent = ok(args(
        troupe(&server, data.path()),
        "group broadcast --workspace alpha --message hello --request-id once",
    ))
    .await;
    let mut reached: Vec<&str> = sent["recipients"]
        .as_array()
        .expect("recipients")
        .iter()
        .map(|r| {
            assert_eq!(r["outcome"], "delivered", "{r}");
            r["session_id"].as_str().expect("id")
        })
        .collect();
    reached.sort_unstable();
    let mut expected = [a.session_id.as_str(), b.session_id.as_str()];
    expected.sort_unstable();
    assert_eq!(reached, expected);
    let again = ok(args(
        troupe(&server, data.path()),
        "group broadcast --workspace alpha --message hello --request-id once",
    ))
    .await;
    assert_eq!(again, sent, "a retry answers the same");
    for (id, count) in [
        (&a.session_id, 2),
        (&b.session_id, 2),
        (&other.session_id, 1),
    ] {
        assert_eq!(server.get(id).await.inbox_count, count, "{id}");
    }

    let groups = ok(args(
        troupe(&server, data.path()),
        "group list --workspace alpha",
    ))
    .await;
    assert_eq!(groups[0]["name"], "pair", "{groups}");
    assert_eq!(groups[0]["member_ids"], serde_json::json!([a.session_id]));
    let none = ok(args(
        troupe(&server, data.path()),
        "group list --workspace beta",
    ))
    .await;
    assert_eq!(none, serde_json::json!([]));
}
