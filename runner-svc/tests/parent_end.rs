//! Parent-end policies with real agents: scripted demo agents in the
//! workspace container create their children through the real MCP bridge
//! (`create_session`'s `on_parent_end`), three levels below a root whose
//! process then exits on its own. Its `terminate` child is terminated with
//! its `terminate` child (their processes stopped); the `abandon` and
//! `notify` children run on as orphans, with their own children; each
//! `notify` child reads the `parent_ended` line on its stdin, from Troupe.

use crate::common;

use std::time::Duration;

use common::pair::*;
use serde_json::{Value, json};
use troupe_proto::session::{self as pb, SessionStatus};
use troupe_tests::message;

const ECHO: &str = "while read -r line; do printf '%s\\n' \"$line\"; done";

/// A demo agent's plan: spawn `children` (async), then wait for messages
/// (`waits`; a `terminate`d agent never gets them), then exit.
fn plan(children: Vec<Value>, waits: u32) -> Value {
    json!({"spawn": children, "wait_messages": waits})
}

fn spawn(agent: &str, title: &str, policy: &str, message: Value) -> Value {
    json!({"agent": agent, "title": title, "mode": "async", "on_parent_end": policy,
           "message": message})
}

/// Waits until `title` is among `parent`'s children, running; returns it.
async fn running_child(pair: &Pair, parent: &str, title: &str) -> pb::Session {
    let deadline = tokio::time::Instant::now() + MINUTE;
    loop {
        let got = pair.get(parent).await;
        if let Some(child) = got.children.iter().find(|c| c.title == title)
            && child.status() == SessionStatus::Running
        {
            return child.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{title} never ran under {parent}: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `session_id`'s agent echoed a `parent_ended` notice from
/// Troupe; returns the line and the notice.
async fn parent_ended_line(pair: &Pair, session_id: &str) -> (Value, Value) {
    let deadline = tokio::time::Instant::now() + MINUTE;
    loop {
        let tail = pair.get(session_id).await.result.unwrap().output_tail;
        let found = events(&tail).into_iter().find_map(|line| {
            let notice: Value = serde_json::from_str(line["message"].as_str()?).ok()?;
            (notice["type"] == "parent_ended").then_some((line, notice))
        });
        if let Some(found) = found {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no parent_ended line from {session_id}: {tail}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_parents_exit_terminates_abandons_and_notifies_its_children_by_policy() {
    require_agent_tools();
    let pair = Pair::start_with(|c| c.limits.max_depth = 3).await;
    let ws = pair.runner.workspace("parentend");
    pair.agent_command(&ws, "demo", &["troupe-demo-agent"]);
    pair.agent(&ws, "echo", ECHO);
    pair.agent(&ws, "sleeper", "sleep 1000");

    // p ── t (terminate) ── tt (terminate) ─┬─ ttn (notify, echo)
    //   │                                   └─ tta (abandon, sleeper)
    //   ├─ a (abandon) ── at (terminate, sleeper)
    //   └─ n (notify, echo)
    let tt = plan(
        vec![
            spawn("echo", "ttn", "notify", json!("x")),
            spawn("sleeper", "tta", "abandon", json!("x")),
        ],
        9,
    );
    let t = plan(vec![spawn("demo", "tt", "terminate", tt)], 9);
    let a = plan(vec![spawn("sleeper", "at", "terminate", json!("x"))], 9);
    let p = plan(
        vec![
            spawn("demo", "t", "terminate", t),
            spawn("demo", "a", "abandon", a),
            spawn("echo", "n", "notify", json!("x")),
        ],
        1,
    );
    let root = pair.root(&ws, "demo", &p.to_string()).await;
    let p_id = root.session_id.clone();
    let t = running_child(&pair, &p_id, "t").await;
    let a = running_child(&pair, &p_id, "a").await;
    let n = running_child(&pair, &p_id, "n").await;
    let tt = running_child(&pair, &t.session_id, "tt").await;
    let ttn = running_child(&pair, &tt.session_id, "ttn").await;
    let tta = running_child(&pair, &tt.session_id, "tta").await;
    let at = running_child(&pair, &a.session_id, "at").await;
    for (s, policy) in [
        (&t, pb::ParentEndPolicy::Terminate),
        (&a, pb::ParentEndPolicy::Abandon),
        (&n, pb::ParentEndPolicy::Notify),
        (&ttn, pb::ParentEndPolicy::Notify),
        (&tta, pb::ParentEndPolicy::Abandon),
    ] {
        assert_eq!(s.on_parent_end(), policy, "{}", s.title);
    }

    // The root's agent gets the message it waits for, and exits by itself.
    pair.server
        .operator()
        .await
        .send_message(message(p_id.clone(), "you may go"))
        .await
        .expect("send");
    pair.wait_status(&p_id, SessionStatus::Completed).await;

    // Terminated by the cascade, their agents stopped.
    for s in [&t, &tt] {
        let deadline = tokio::time::Instant::now() + MINUTE;
        let got = loop {
            let got = pair.get(&s.session_id).await;
            if got.result.as_ref().unwrap().exit_code.is_some() {
                break got;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} never stopped: {got:?}",
                s.title
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let session = got.session.unwrap();
        assert_eq!(session.status(), SessionStatus::Terminated, "{}", s.title);
        assert_eq!(session.end_reason, "cascade", "{}", s.title);
    }
    // Orphans run on, with their own children (not orphans).
    for (s, orphan) in [
        (&a, true),
        (&n, true),
        (&ttn, true),
        (&tta, true),
        (&at, false),
    ] {
        let session = pair.get(&s.session_id).await.session.unwrap();
        assert_eq!(session.status(), SessionStatus::Running, "{}", s.title);
        assert_eq!(session.orphaned, orphan, "{}", s.title);
    }
    // The notified read how their parent ended, from Troupe, once.
    let (line, notice) = parent_ended_line(&pair, &n.session_id).await;
    assert_eq!(line["sender"], "troupe", "{line}");
    assert!(
        !line.to_string().contains(&p_id),
        "the parent is not named: {line}"
    );
    assert_eq!(
        notice,
        json!({"reason": "exited", "status": "completed",
                              "type": "parent_ended"})
    );
    let (_, notice) = parent_ended_line(&pair, &ttn.session_id).await;
    assert_eq!(notice["status"], "terminated");
    assert_eq!(notice["reason"], "cascade");
    let n_tail = pair.get(&n.session_id).await.result.unwrap().output_tail;
    assert_eq!(n_tail.matches("parent_ended").count(), 1, "{n_tail}");

    // The orphans still answer to the tree: the operator ends them.
    let mut operator = pair.server.operator().await;
    let ended = operator
        .terminate_session(troupe_tests::terminate(p_id.clone()))
        .await
        .expect("terminate the ended root's orphans")
        .into_inner()
        .terminated_session_ids;
    assert_eq!(ended.len(), 5, "{ended:?}");
}
