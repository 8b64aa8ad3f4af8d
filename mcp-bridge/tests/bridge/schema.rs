//! The tools a client lists: every one, with its input schema.

use super::*;

#[tokio::test]
async fn tools_list_shows_every_tool_with_its_schema() {
    let server = TestServer::start().await;
    let (_, _, token) = server.root("ws", TrustLevel::Direct).await;
    let mut connection = stdio(&unix_endpoint(&server), &token, vec![]);
    connection["list_tools"] = json!(true);
    let out = drive(vec![connection]).await;
    assert_eq!(out[0]["server_info"]["name"], "troupe-mcp");
    let tools = out[0]["tools"].as_array().expect("tools");
    let mut names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    names.sort();
    let mut expected = TOOLS.to_vec();
    expected.sort();
    assert_eq!(names, expected);
    let tool = |name: &str| tools.iter().find(|t| t["name"] == name).unwrap().clone();
    for t in tools {
        assert!(t["description"].as_str().unwrap().len() > 40, "{t}");
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
    }

    let create = tool("create_session");
    let schema = &create["inputSchema"];
    let mut required: Vec<&str> = schema["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    required.sort();
    assert_eq!(required, ["agent_name", "initial_message", "title"]);
    for field in [
        "title",
        "agent_name",
        "initial_message",
        "trust_level",
        "mode",
        "budget_usd",
        "budget_tokens",
        "budget_calls",
        "budget_wall_secs",
        "writable_paths",
        "on_parent_end",
    ] {
        let property = &schema["properties"][field];
        assert!(
            !property.is_null(),
            "create_session lacks {field}: {schema}"
        );
    }
    assert!(
        create["description"]
            .as_str()
            .unwrap()
            .contains("can only narrow this session's"),
        "{create}"
    );
    let schema_text = schema.to_string();
    for word in [
        "async",
        "sync",
        "callback",
        "sandboxed",
        "direct",
        "terminate",
        "abandon",
        "notify",
    ] {
        assert!(
            schema_text.contains(word),
            "{word} missing from {schema_text}"
        );
    }
    assert!(
        schema["properties"]["title"]["description"]
            .as_str()
            .is_some_and(|d| !d.is_empty())
    );

    let send = tool("send_message");
    assert_eq!(
        send["inputSchema"]["required"],
        json!(["session_id", "message"])
    );
    let wait = tool("wait_for_session");
    assert_eq!(wait["inputSchema"]["required"], json!(["session_id"]));
    assert!(!wait["inputSchema"]["properties"]["timeout_s"].is_null());
    assert_eq!(tool("get_session")["annotations"]["readOnlyHint"], true);
    assert_eq!(
        tool("terminate_session")["annotations"]["destructiveHint"],
        true
    );
    assert_eq!(
        tool("report_progress")["inputSchema"]["required"],
        json!(["progress"])
    );
    let finish = tool("finish");
    assert_eq!(finish["inputSchema"]["required"], json!(["result"]));
    let outcome = finish["inputSchema"]["properties"]["outcome"].to_string();
    assert!(
        outcome.contains("success") && outcome.contains("failure"),
        "{outcome}"
    );
    assert_eq!(
        tool("reply_to_parent")["inputSchema"]["required"],
        json!(["message"])
    );
    let broadcast = tool("broadcast");
    assert_eq!(broadcast["inputSchema"]["required"], json!(["message"]));
    let scope = broadcast["inputSchema"]["properties"]["scope"].to_string();
    for word in ["workspace", "subtree", "children"] {
        assert!(scope.contains(word), "{word} missing from {scope}");
    }
    assert_eq!(
        tool("post_to_group")["inputSchema"]["required"],
        json!(["group", "message"])
    );
    assert_eq!(
        tool("add_to_group")["inputSchema"]["required"],
        json!(["group", "session_ids"])
    );
    assert_eq!(tool("list_groups")["annotations"]["readOnlyHint"], true);
}
