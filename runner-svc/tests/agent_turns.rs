//! A message sent to a running agent of each runtime reaches its model as
//! a new turn of the same conversation: each of Claude Code, Codex, Gemini
//! CLI, OpenCode and Aider, run for real from its example file, is given a
//! first task and then an operator's message; its model's next request
//! holds the message (with its sender's line) and the answer to the first,
//! so the conversation was resumed, not begun again, and a message that
//! reads as flags is text to the model. Each turn ends with Troupe's line
//! holding the answer. Aider, a leaf worker, then finishes with its last
//! answer as its result.

use crate::common;

use common::{
    clis,
    pair::{Pair, require_agent_tools},
    *,
};
use troupe_proto::session as pb;
use troupe_tests::upstream::{Turn, Upstream};

const AGENTS: [&str; 5] = ["claude", "codex", "gemini", "opencode", "aider"];

fn runtime(agent: &str) -> &'static str {
    match agent {
        "claude" => "claude-code",
        "gemini" => "gemini-cli",
        "codex" => "codex",
        "opencode" => "opencode",
        _ => "aider",
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_reaches_each_runtimes_model_as_a_new_turn() {
    require_agent_tools();
    let Some((image, clis)) = tokio::task::spawn_blocking(clis::agents_image)
        .await
        .unwrap()
    else {
        return;
    };
    let agents: Vec<&str> = AGENTS
        .into_iter()
        .filter(|a| clis.iter().any(|c| c == runtime(a)))
        .collect();
    let mut upstreams = Vec::new();
    for agent in &agents {
        let turns = vec![
            Turn::text(&format!("ANSWER-ONE-{agent}")),
            Turn::text(&format!("ANSWER-TWO-{agent}")),
        ];
        upstreams.push(Upstream::tcp(turns).await);
    }
    let models: Vec<String> = agents.iter().map(|a| format!("{a}-model")).collect();
    let routes: Vec<clis::Route> = agents
        .iter()
        .zip(&upstreams)
        .zip(&models)
        .map(|((agent, upstream), model)| clis::Route {
            provider: agent,
            kind: clis::provider_kind(agent),
            model,
            url: upstream.base_url(),
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let config = clis::gateway_config(dir.path(), &routes);
    let pair = Pair::start_on(
        move |r| r.image = image,
        move |c| c.gateway_config = Some(config),
    )
    .await;
    let ws = pair.runner.workspace("turns");
    let mut operator = pair.server.operator().await;
    let mut roots = Vec::new();
    for (agent, model) in agents.iter().zip(&models) {
        pair.server
            .write_agent_text(Some(&ws), agent, &clis::example(agent, model));
        let root = pair
            .root(&ws, agent, &format!("FIRST-TASK for {agent}"))
            .await;
        // Sent at once: it waits on stdin while the first turn runs. It
        // reads as flags: it must reach the model as text, never the CLI's
        // command line.
        operator
            .send_message(pb::SendMessageRequest {
                session_id: root.session_id.clone(),
                message: format!("--help -p x SECOND-MESSAGE for {agent}"),
                ..Default::default()
            })
            .await
            .expect("send");
        roots.push(root);
    }

    for ((agent, upstream), root) in agents.iter().zip(&upstreams).zip(&roots) {
        let deadline = tokio::time::Instant::now() + 3 * MINUTE;
        let second = loop {
            let seen = upstream.requests();
            if let Some(second) = seen
                .iter()
                .find(|r| r.body.to_string().contains("SECOND-MESSAGE"))
            {
                break second.body.to_string();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{agent}'s model never got the second message: {seen:#?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        };
        for said in [
            "from the operator".to_owned(),
            format!("--help -p x SECOND-MESSAGE for {agent}"),
            format!("FIRST-TASK for {agent}"),
            format!("ANSWER-ONE-{agent}"),
        ] {
            assert!(second.contains(&said), "{agent}: {said} in {second}");
        }
        // A CLI that takes a turn per message ends each with Troupe's line,
        // its answer parsed from the CLI's own output.
        if *agent != "claude" {
            let ended = format!("\"answer\":\"ANSWER-TWO-{agent}\"");
            let deadline = tokio::time::Instant::now() + MINUTE;
            loop {
                let tail = pair
                    .get(&root.session_id)
                    .await
                    .result
                    .map(|r| r.output_tail)
                    .unwrap_or_default();
                if tail
                    .lines()
                    .any(|l| l.contains("\"type\":\"troupe.turn_end\"") && l.contains(&ended))
                {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{agent}'s output has no end of its second turn: {tail}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
        }
        if *agent == "aider" {
            let got = pair
                .wait_status(&root.session_id, pb::SessionStatus::Completed)
                .await;
            let finished = got.result.and_then(|r| r.finished).expect("a result");
            assert_eq!(finished.result, "ANSWER-TWO-aider");
        } else {
            pair.terminate(&root.session_id).await;
        }
    }
}
