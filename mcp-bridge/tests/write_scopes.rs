//! `create_session`'s `writable_paths` through `troupe-mcp`, driven by the
//! MCP Python SDK against a real session service: a child gets the scope it
//! asks inside its parent's; a wider one is refused by the session service
//! (SCOPE_ESCALATION, with what to do); a malformed path is refused by the
//! bridge, naming the argument; nothing else is created.

use crate::common;

use common::*;
use serde_json::json;
use troupe_proto::session::{self as pb, TrustLevel};
use troupe_tests::TestServer;

#[tokio::test]
async fn a_child_gets_the_scope_asked_and_never_a_wider_one() {
    let server = TestServer::start().await;
    let root = server
        .operator()
        .await
        .create_root_session(pb::CreateRootSessionRequest {
            workspace_id: "ws".to_owned(),
            trust_level: TrustLevel::Direct as i32,
            agent_name: "worker".to_owned(),
            writable_paths: vec!["/workspace/src".to_owned()],
            ..Default::default()
        })
        .await
        .expect("root")
        .into_inner();
    let root_id = root.session.expect("session").session_id;
    let create = |paths: serde_json::Value| {
        call(
            "create_session",
            json!({"title": "t", "agent_name": "worker", "initial_message": "go",
                   "writable_paths": paths}),
        )
    };
    let out = drive(vec![stdio(
        &unix_endpoint(&server),
        &root.session_token,
        vec![
            create(json!(["/workspace/src/lib/"])),
            create(json!(["/workspace"])),
            create(json!(["/workspace/../etc"])),
        ],
    )])
    .await;
    let results = &out[0]["results"];

    let created = ok(&results[0]);
    assert_eq!(
        created["session"]["writable_paths"],
        json!(["/workspace/src/lib"]),
        "{created}"
    );
    let child = created["session"]["session_id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(server.stored_scope(&child).await, ["/workspace/src/lib"]);

    let text = refused(&results[1], "SCOPE_ESCALATION");
    assert_eq!(
        results[1]["structuredContent"]["error"]["source"],
        "session-service"
    );
    assert!(text.contains("inherit"), "{text}");

    let text = refused(&results[2], "INVALID_ARGUMENT");
    let error = &results[2]["structuredContent"]["error"];
    assert_eq!(error["source"], "bridge", "{error}");
    assert_eq!(error["metadata"]["field"], "writable_paths", "{error}");
    assert!(text.contains(".."), "{text}");

    let children = server.get(&root_id).await.children;
    assert_eq!(
        children.len(),
        1,
        "only the first was created: {children:?}"
    );
}
