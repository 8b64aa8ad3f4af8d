//! An agent's life as the service records it: it runs, reads its
//! messages, its output and exit reach the ledger and its watchers, the
//! tail kept is the configured one, and terminating a tree stops every
//! process.

use super::*;

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
    let root = pair.running_root(&ws, "worker", "do the thing").await;
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
    let mut events = pair.watch(&root.session_id).await;
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
