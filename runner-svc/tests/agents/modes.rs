//! Execution modes and teams: `sync` returns the child's end, `callback`
//! tells the parent; the demo agents build a team through the bridge.

use super::*;

#[tokio::test]
async fn sync_returns_the_childs_end_and_callback_tells_the_parent() {
    let pair = Pair::start().await;
    let ws = pair.runner.workspace("modes");
    // The parent prints every line its stdin receives, as it came.
    pair.agent(
        &ws,
        "parent",
        "while read -r line; do printf '%s\\n' \"$line\"; done",
    );
    pair.agent(&ws, "quick", "read m; echo \"finished: $m\"");
    let root = pair.running_root(&ws, "parent", "start").await;

    let sync = pair
        .child(&root.session_id, "quick", ExecutionMode::Sync)
        .await;
    assert_eq!(sync.session.unwrap().status(), SessionStatus::Completed);
    let result = sync.result.unwrap();
    assert_eq!(result.exit_code, Some(0));
    assert!(result.output_tail.contains("finished: "), "{result:?}");
    assert!(result.output_tail.contains("hello quick"), "{result:?}");

    let callback = pair
        .child(&root.session_id, "quick", ExecutionMode::Callback)
        .await;
    let callback_id = callback.session.unwrap().session_id;
    assert!(callback.result.is_none());
    // The parent echoes its stdin line; the notice is that line's message.
    let notice = pair.notice_of(&root.session_id, &callback_id).await;
    assert_eq!(notice["type"], "session_ended", "{notice}");
    assert_eq!(notice["status"], "completed", "{notice}");
    assert_eq!(notice["exit_code"], 0, "{notice}");
}

/// The scripted demo agent, in the container, through the real MCP bridge
/// over the session service's Unix socket: a coordinator builds a team.
#[tokio::test]
async fn agents_build_a_team_through_the_bridge_in_the_container() {
    require_agent_tools();
    let pair = Pair::start().await;
    let ws = pair.runner.workspace("team");
    for name in ["coordinator", "specialist"] {
        pair.agent_command(&ws, name, &["troupe-demo-agent"]);
    }
    let plan = team_plan();
    let root = pair.root(&ws, "coordinator", &plan.to_string()).await;
    let done = pair
        .wait_status(&root.session_id, SessionStatus::Completed)
        .await;
    let root_out = events(&done.result.unwrap().output_tail);

    let lead = &done.children[0];
    let lead_view = pair
        .wait_status(&lead.session_id, SessionStatus::Completed)
        .await;
    let helper = &lead_view.children[0];
    let helper_view = pair
        .wait_status(&helper.session_id, SessionStatus::Completed)
        .await;
    assert_eq!((lead.depth, helper.depth), (1, 2));
    assert!(
        helper_view.children.is_empty(),
        "nothing below the depth limit"
    );

    // The depth limit refused the third level, with its reason.
    let helper_out = events(&helper_view.result.unwrap().output_tail);
    assert!(
        helper_out
            .iter()
            .any(|e| e["event"] == "refused" && e["reason"] == "DEPTH_EXCEEDED"),
        "{helper_out:?}"
    );
    // Messages went both ways: down from the root, up from each child.
    let said = |out: &[serde_json::Value], from: &str, text: &str| {
        out.iter().any(|e| {
            e["event"] == "message"
                && e["from"] == format!("session:{from}")
                && e["message"] == text
        })
    };
    let lead_out = events(&lead_view.result.unwrap().output_tail);
    assert!(
        said(&lead_out, &root.session_id, "use axum"),
        "{lead_out:?}"
    );
    assert!(
        said(&lead_out, &helper.session_id, "handlers done"),
        "{lead_out:?}"
    );
    assert!(
        said(&root_out, &lead.session_id, "backend done"),
        "{root_out:?}"
    );
    assert!(
        root_out
            .iter()
            .any(|e| e["event"] == "child_ended" && e["session_id"] == lead.session_id.as_str()),
        "{root_out:?}"
    );
}
