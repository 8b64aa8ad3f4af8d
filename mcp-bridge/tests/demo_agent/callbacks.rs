//! `collect`: each callback child's report, and the messages that arrive
//! meanwhile.

use super::*;

#[tokio::test]
async fn collect_reports_each_callback_child_and_the_messages_meanwhile() {
    let server = TestServer::start().await;
    let (root, _, _) = server.root("ws", TrustLevel::Direct).await;
    let plan = json!({
        "spawn": [
            {"agent": "worker", "title": "a"},
            {"agent": "worker", "title": "b", "mode": "callback"},
            {"agent": "worker", "title": "c", "mode": "async"},
        ],
        "wait_messages": 1,
        "collect": true,
        "collect_timeout_s": 10,
    });
    let mut agent = Agent::start(Some(&server), Some((&root.session_id, None))).await;
    agent.write("operator", &plan.to_string()).await;
    agent.until("spawned", 3).await;
    let ids: Vec<String> = agent.events.iter().map(id_of).collect();
    let long_tail = format!("{}END", "x".repeat(500));
    // a's end arrives while the agent waits for a message: it is kept for collect.
    agent.ended(&ids[0], "completed", 0, &long_tail).await;
    agent.write(&format!("session:{}", ids[2]), "a note").await;
    // Notices of sessions it does not collect are ignored; c is async.
    agent.ended("sess_unrelated", "failed", 1, "").await;
    agent.ended(&ids[2], "completed", 0, "").await;
    agent.write("operator", "carry on").await;
    agent.ended(&ids[1], "failed", 7, "boom").await;
    let run = agent.finish(false).await;

    assert_eq!(run.code, Some(0), "{:#?}", run.events);
    assert_eq!(
        run.names(),
        [
            "spawned",
            "spawned",
            "spawned",
            "message",
            "child_ended",
            "message",
            "child_ended",
            "done"
        ],
        "{:#?}",
        run.events
    );
    let messages = run.all("message");
    assert_eq!(messages[0]["from"], format!("session:{}", ids[2]));
    assert_eq!(messages[0]["message"], "a note");
    assert_eq!(messages[1]["from"], "operator");
    let ended = run.all("child_ended");
    assert_eq!(ended[0]["session_id"], ids[0].as_str());
    assert_eq!(ended[0]["status"], "completed");
    assert_eq!(ended[0]["exit_code"], 0);
    let tail = ended[0]["output_tail"].as_str().expect("tail");
    assert!(
        tail.ends_with("END") && tail.chars().count() == 200,
        "{tail}"
    );
    assert_eq!(ended[1]["session_id"], ids[1].as_str());
    assert_eq!(ended[1]["status"], "failed");
    assert_eq!(ended[1]["exit_code"], 7);
    assert_eq!(ended[1]["output_tail"], "boom");
    server.stop().await;
}
