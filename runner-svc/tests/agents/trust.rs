//! Trust between agents in the container: a sandboxed agent reaches no
//! direct session, whatever it claims, and is not told a direct sender's id.

use super::*;

/// A sandboxed agent, even one that claims `direct` in its environment and
/// names a direct session's id, cannot list, message or spawn direct
/// sessions, and is not told its direct parent's id.
#[tokio::test]
async fn a_sandboxed_agent_cannot_reach_direct_sessions_whatever_it_claims() {
    let pair = Pair::start().await;
    let ws = pair.runner.workspace("sandbox");
    pair.agent(&ws, "holder", "sleep 1000");
    pair.agent_command(
        &ws,
        "sneaky",
        &[
            "env",
            "PARACHUTE_TRUST_LEVEL=direct",
            "TROUPE_TRUST_LEVEL=direct",
            "troupe-demo-agent",
        ],
    );
    let root = pair.running_root(&ws, "holder", "hold").await;
    let plan = serde_json::json!({
        "spawn": [{"agent": "sneaky", "title": "escalate", "trust_level": "direct", "message": "x"}],
        "list": true,
        "send": [
            {"to": root.session_id, "message": "hello, direct root"},
            {"to": "parent", "message": "hello, parent"},
        ],
    });
    let child = pair
        .server
        .operator()
        .await
        .create_session(CreateSessionRequest {
            title: "sneaky".into(),
            agent_name: "sneaky".into(),
            initial_message: plan.to_string(),
            parent_session_id: root.session_id.clone(),
            trust_level: TrustLevel::Sandboxed as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    let out = pair.completed_events(&child.session_id).await;
    let refused: Vec<&str> = out
        .iter()
        .filter(|e| e["event"] == "refused")
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert_eq!(
        refused,
        vec!["TRUST_ESCALATION", "SESSION_NOT_FOUND"],
        "{out:?}"
    );
    let listed = out.iter().find(|e| e["event"] == "listed").expect("listed");
    assert_eq!(
        listed["session_ids"],
        serde_json::json!([child.session_id]),
        "{out:?}"
    );
    // Its environment does not name the direct parent.
    assert!(
        out.iter()
            .any(|e| e["event"] == "error"
                && e["text"].as_str().unwrap_or_default().contains("parent")),
        "{out:?}"
    );
    assert_eq!(pair.get(&root.session_id).await.inbox_count, 1);
}

/// The stdin lines of a sandboxed agent never carry a direct session's id:
/// a message from its direct parent, at creation and later, names its
/// sender only as `session`, while a sandboxed sender is named.
#[tokio::test]
async fn a_sandboxed_agent_is_not_told_a_direct_senders_id() {
    let pair = Pair::start().await;
    let ws = pair.runner.workspace("senders");
    pair.agent(&ws, "holder", "sleep 1000");
    pair.agent(&ws, "reader", "head -n 3");
    let root = pair.running_root(&ws, "holder", "hold").await;
    let mut as_root = pair.server.act_as(&root.session_id).await;
    let create = |title: &str| CreateSessionRequest {
        title: title.into(),
        agent_name: "reader".into(),
        initial_message: format!("{title}: first"),
        trust_level: TrustLevel::Sandboxed as i32,
        ..Default::default()
    };
    let sibling = as_root
        .create_session(create("sibling"))
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    let reader = as_root
        .create_session(create("reader"))
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    pair.wait_status(&reader.session_id, SessionStatus::Running)
        .await;
    as_root
        .send_message(pb::SendMessageRequest {
            session_id: reader.session_id.clone(),
            message: "second".into(),
            request_id: String::new(),
        })
        .await
        .unwrap();
    let mut as_sibling = pair.server.act_as(&sibling.session_id).await;
    as_sibling
        .send_message(pb::SendMessageRequest {
            session_id: reader.session_id.clone(),
            message: "third".into(),
            request_id: String::new(),
        })
        .await
        .unwrap();
    let done = pair
        .wait_status(&reader.session_id, SessionStatus::Completed)
        .await;
    let output = done.result.unwrap().output_tail;
    assert!(!output.contains(&root.session_id), "{output}");
    let senders: Vec<String> = events(&output)
        .iter()
        .map(|line| line["sender"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        senders,
        vec![
            "session".to_owned(),
            "session".to_owned(),
            format!("session:{}", sibling.session_id)
        ],
        "{output}"
    );
}
