//! The session service driving the runner, both real: sessions start their
//! agents, statuses follow the processes, output and exits reach the ledger
//! and its watchers, messages reach stdin, termination stops processes,
//! execution modes, and trust between agents in the container. Restarts and
//! outages of either side are in `restarts.rs`.

mod common;

use std::time::Duration;

use common::{pair::*, *};
use tokio_stream::StreamExt;
use troupe_proto::session::{
    self as pb, CreateSessionRequest, DeliveryStatus, EventKind, ExecutionMode, SendMessageRequest,
    SessionStatus, TerminateSessionRequest, TrustLevel, WatchSessionsRequest,
    session_event::Detail,
};

#[tokio::test]
async fn an_agent_runs_reads_its_messages_and_its_exit_is_recorded() {
    let pair = Pair::start().await;
    let ws = pair.runner.workspace("life");
    pair.agent(
        &ws,
        "worker",
        "read first; echo \"got $first\"; read second; echo \"then $second\"; \
         echo \"ctx $TROUPE_SESSION_ID $TROUPE_TRUST_LEVEL $PARACHUTE_WORKSPACE_ID\" >&2; \
         test -n \"$TROUPE_SESSION_TOKEN\" && exit 3",
    );
    let root = pair.root(&ws, "worker", "do the thing").await;
    pair.wait_status(&root.session_id, SessionStatus::Running)
        .await;
    let sent = pair
        .server
        .operator()
        .await
        .send_message(SendMessageRequest {
            session_id: root.session_id.clone(),
            message: "and this".into(),
            request_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(sent.delivery(), DeliveryStatus::Delivered);

    let done = pair
        .wait_status(&root.session_id, SessionStatus::Failed)
        .await;
    let session = done.session.unwrap();
    assert_eq!(session.exit_code, Some(3));
    assert_eq!(session.end_reason, "exit code 3");
    let tail = done.result.unwrap().output_tail;
    assert!(
        tail.contains(r#"got {"message":"do the thing","message_id":"#)
            && tail.contains(r#""sequence":1,"#),
        "{tail}"
    );
    assert!(
        tail.contains(r#""message":"and this""#) && tail.contains(r#""sequence":2"#),
        "{tail}"
    );
    assert!(
        tail.contains(&format!("ctx {} direct {ws}", root.session_id)),
        "{tail}"
    );

    // The watch stream tells the same story, in order.
    let mut events = pair
        .server
        .operator()
        .await
        .watch_sessions(WatchSessionsRequest {
            session_id: root.session_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut kinds = Vec::new();
    let mut printed = Vec::new();
    while let Ok(Some(Ok(event))) =
        tokio::time::timeout(Duration::from_secs(2), events.next()).await
    {
        let kind = event.kind();
        kinds.push(kind);
        match event.detail {
            Some(Detail::Output(out)) => printed.extend_from_slice(&out.data),
            Some(Detail::Ended(end)) => {
                assert_eq!((end.exit_code, end.reason.as_str()), (3, "exited"));
            }
            _ => {}
        }
        if kind == EventKind::Failed {
            break;
        }
    }
    assert_eq!(kinds.first(), Some(&EventKind::Created));
    assert!(kinds.contains(&EventKind::Started), "{kinds:?}");
    assert!(kinds.contains(&EventKind::Output), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&EventKind::Failed));
    assert_eq!(String::from_utf8_lossy(&printed), tail);
}

#[tokio::test]
async fn terminating_a_tree_stops_every_process() {
    let pair = Pair::start().await;
    let ws = pair.runner.workspace("cascade");
    pair.agent(&ws, "lead", "sleep 1001");
    pair.agent(&ws, "helper", "sleep 1002 & sleep 1003");
    pair.agent(&ws, "deep", "sleep 1004");
    let root = pair.root(&ws, "lead", "go").await;
    let child = pair
        .child(&root.session_id, "helper", ExecutionMode::Async)
        .await;
    let child_id = child.session.unwrap().session_id;
    let grandchild = pair.child(&child_id, "deep", ExecutionMode::Async).await;
    let grandchild_id = grandchild.session.unwrap().session_id;
    for id in [&root.session_id, &child_id, &grandchild_id] {
        pair.wait_status(id, SessionStatus::Running).await;
    }
    // The check below sees the tree's processes while they run.
    let deadline = tokio::time::Instant::now() + MINUTE;
    for attempt in 0.. {
        let ps = run_sh(&pair.runner, &ws, &format!("ps-{attempt}"), "ps -o args")
            .await
            .stdout_text();
        if ["1001", "1002", "1003", "1004"]
            .iter()
            .all(|n| ps.contains(&format!("sleep {n}")))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not all running:\n{ps}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let ended = pair
        .server
        .operator()
        .await
        .terminate_session(TerminateSessionRequest {
            session_id: root.session_id.clone(),
            reason: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .terminated_session_ids;
    assert_eq!(
        ended,
        vec![
            root.session_id.clone(),
            child_id.clone(),
            grandchild_id.clone()
        ]
    );

    // Their processes end; nothing keeps running in the container.
    for id in [&root.session_id, &child_id, &grandchild_id] {
        let deadline = tokio::time::Instant::now() + MINUTE;
        while pair.get(id).await.session.unwrap().exit_code.is_none() {
            assert!(tokio::time::Instant::now() < deadline, "{id} kept running");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            pair.get(id).await.session.unwrap().status(),
            SessionStatus::Terminated
        );
    }
    let ps = run_sh(&pair.runner, &ws, "ps", "ps -o args")
        .await
        .stdout_text();
    for n in ["1001", "1002", "1003", "1004"] {
        assert!(!ps.contains(&format!("sleep {n}")), "left behind:\n{ps}");
    }
}

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
    let root = pair.root(&ws, "parent", "start").await;
    pair.wait_status(&root.session_id, SessionStatus::Running)
        .await;

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
    let root = pair.root(&ws, "holder", "hold").await;
    pair.wait_status(&root.session_id, SessionStatus::Running)
        .await;
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
    let done = pair
        .wait_status(&child.session_id, SessionStatus::Completed)
        .await;
    let out = events(&done.result.unwrap().output_tail);
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
    let root = pair.root(&ws, "holder", "hold").await;
    pair.wait_status(&root.session_id, SessionStatus::Running)
        .await;
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

/// What is kept of an agent's output is the configured tail: its latest
/// bytes, whole up to the limit.
#[tokio::test]
async fn the_output_kept_is_the_configured_tail() {
    let pair = Pair::start_with(|c| c.output_tail_bytes = 64).await;
    let ws = pair.runner.workspace("tail");
    pair.agent(
        &ws,
        "talker",
        "i=0; while [ $i -lt 100 ]; do printf '%04d|' $i; i=$((i+1)); done",
    );
    let root = pair.root(&ws, "talker", "go").await;
    let done = pair
        .wait_status(&root.session_id, SessionStatus::Completed)
        .await;
    let printed: String = (0..100).map(|i| format!("{i:04}|")).collect();
    assert_eq!(
        done.result.unwrap().output_tail,
        printed[printed.len() - 64..],
        "the last 64 bytes of {} printed",
        printed.len()
    );
}
