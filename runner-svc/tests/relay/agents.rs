//! Agents in containers reach the service through the relay: a tree built
//! through it, and an endpoint that is down passed over.

use super::*;

/// The demo agent, in the container, creates a child through `troupe-mcp`
/// over the relayed socket, and the child runs: the tree forms as with the
/// service's own socket, and the audit names the agent's own session as the
/// caller.
#[tokio::test]
async fn an_agent_builds_a_tree_through_the_relay() {
    require_agent_tools();
    let pair = Pair::relayed(live, |_| {}).await;
    let ws = pair.runner.workspace("relay-tree");
    for name in ["coordinator", "specialist"] {
        pair.agent_command(&ws, name, &["troupe-demo-agent"]);
    }
    let plan = serde_json::json!({
        "spawn": [{
            "agent": "specialist",
            "title": "child",
            "mode": "callback",
            "message": {"say": "child here", "reply": "child done"},
        }],
        "wait_messages": 1,
        "collect": true,
    });
    let root = pair.root(&ws, "coordinator", &plan.to_string()).await;
    let done = pair
        .wait_status(&root.session_id, SessionStatus::Completed)
        .await;
    let root_out = events(&done.result.unwrap().output_tail);
    let child = done.children.first().expect("a child");
    assert_eq!(
        (child.parent_session_id.as_str(), child.depth),
        (root.session_id.as_str(), 1)
    );
    let child_out = pair.completed_events(&child.session_id).await;
    assert!(
        child_out
            .iter()
            .any(|e| e["event"] == "say" && e["text"] == "child here"),
        "{child_out:?}"
    );
    assert!(
        root_out.iter().any(|e| e["event"] == "message"
            && e["from"] == format!("session:{}", child.session_id)
            && e["message"] == "child done"),
        "{root_out:?}"
    );

    // The service saw the agent's own token: the creation is the root's.
    let created = creation_of(&pair, &root.session_id, &child.session_id).await;
    assert_eq!(created.caller, format!("session:{}", root.session_id));
    assert!(created.allowed, "{created:?}");
}

/// With a dead endpoint first, each connection goes on to the live one.
#[tokio::test]
async fn an_agent_reaches_the_service_past_a_dead_endpoint() {
    require_agent_tools();
    let dead = dead_endpoint().await;
    let pair = Pair::relayed(|addr| vec![dead, format!("http://{addr}")], |_| {}).await;
    let ws = pair.runner.workspace("relay-dead");
    pair.agent_command(&ws, "lister", &["troupe-demo-agent"]);
    let root = pair
        .root(
            &ws,
            "lister",
            &serde_json::json!({"list": true}).to_string(),
        )
        .await;
    let out = pair.completed_events(&root.session_id).await;
    let listed = out
        .iter()
        .find(|e| e["event"] == "listed")
        .unwrap_or_else(|| panic!("nothing listed: {out:?}"));
    assert_eq!(
        listed["session_ids"],
        serde_json::json!([root.session_id]),
        "{out:?}"
    );
}
