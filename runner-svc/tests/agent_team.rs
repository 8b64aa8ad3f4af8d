//! A team of five vendors' CLIs, each run for real in the workspace
//! container (network `none`, no provider key in it) from its example
//! agent file: a Claude Code coordinator hands one task each, `sync`, to a
//! Codex, a Gemini CLI, an OpenCode and an Aider worker. Each worker's model
//! is a scripted upstream of its own API (Responses, Gemini, Chat
//! Completions) behind the gateway; the first three finish with Troupe's
//! `finish` tool as their CLI calls an MCP tool, Aider, which has none, with
//! its answer. The coordinator's model is handed each result, each worker
//! ends `completed` with it, every session's usage is what its upstream
//! reported, to the token, its cost the price table's, and the tree's total
//! their sum. One tree budget stops the team exactly at it.

use crate::common;

use common::{
    clis,
    pair::{Pair, require_agent_tools},
    *,
};
use serde_json::{Value, json};
use troupe_proto::session as pb;
use troupe_tests::upstream::{Turn, Upstream};

const COORDINATOR: &str = "coordinator-model";

/// A worker: its agent file, model, the name its CLI gives Troupe's
/// `finish` tool (none: it has no tools), its task and its result.
struct Worker {
    agent: &'static str,
    model: &'static str,
    finish_tool: Option<&'static str>,
    result: &'static str,
}

const WORKERS: [Worker; 4] = [
    Worker {
        agent: "codex",
        model: "codex-model",
        finish_tool: Some("mcp__troupe__finish"),
        result: "RESULT-CODEX: 6 x 7 = 42",
    },
    Worker {
        agent: "gemini",
        model: "gemini-model",
        finish_tool: Some("mcp_troupe_finish"),
        result: "RESULT-GEMINI: the sky is blue",
    },
    Worker {
        agent: "opencode",
        model: "opencode-model",
        finish_tool: Some("troupe_finish"),
        result: "RESULT-OPENCODE: water boils at 100 C",
    },
    Worker {
        agent: "aider",
        model: "aider-model",
        finish_tool: None,
        result: "RESULT-AIDER: two plus two is four",
    },
];

/// The worker's scripted turns: `finish` with its result (or, without
/// tools, the result as its answer), then a closing text.
fn worker_turns(worker: &Worker) -> Vec<Turn> {
    match worker.finish_tool {
        Some(tool) => vec![
            Turn::tool_use(
                &format!("call_{}", worker.agent),
                tool,
                json!({"result": worker.result, "outcome": "success"}),
            ),
            Turn::text("Finished."),
        ],
        None => vec![Turn::text(worker.result)],
    }
}

/// The `finished` result in a sync create's answer, as the coordinator's
/// model was given it.
fn handed_result(requests: &[troupe_tests::upstream::Recorded], call: &str) -> Option<String> {
    requests
        .iter()
        .flat_map(|r| r.body["messages"].as_array().cloned().unwrap_or_default())
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "tool_result" && b["tool_use_id"] == call)
        .find_map(|b| {
            let text = match &b["content"] {
                Value::String(text) => text.clone(),
                blocks => blocks[0]["text"].as_str()?.to_owned(),
            };
            let answer: Value = serde_json::from_str(&text).ok()?;
            answer["result"]["finished"]["result"]
                .as_str()
                .map(str::to_owned)
        })
}

/// The team, running: the pair, the upstreams and the coordinator's session.
struct Team {
    pair: Pair,
    claude: Upstream,
    /// Each worker's and its upstream.
    workers: Vec<(&'static Worker, Upstream)>,
    root: pb::Session,
    _dir: tempfile::TempDir,
}

impl Team {
    /// Every request any upstream was sent.
    fn calls(&self) -> usize {
        self.claude.requests().len()
            + self
                .workers
                .iter()
                .map(|(_, u)| u.requests().len())
                .sum::<usize>()
    }
}

/// Starts the team, its tree under `budget`; `None` (the test skipped)
/// when the image with every CLI cannot be built.
async fn start(budget: Option<pb::Budget>) -> Option<Team> {
    require_agent_tools();
    let (image, clis) = tokio::task::spawn_blocking(clis::agents_image)
        .await
        .unwrap()?;
    let all = ["claude-code", "codex", "gemini-cli", "opencode", "aider"];
    if !all.iter().all(|cli| clis.iter().any(|c| c == cli)) {
        eprintln!("SKIPPED: the image lacks some CLIs (it holds {clis:?})");
        return None;
    }
    // The coordinator hands each worker its task, in turn, and waits.
    let mut coordinator_turns: Vec<Turn> = WORKERS
        .iter()
        .map(|w| {
            Turn::tool_use(
                &format!("toolu_{}", w.agent),
                "mcp__troupe__create_session",
                json!({"title": w.agent, "agent_name": w.agent, "mode": "sync",
                       "initial_message": format!("TASK for {}: answer, then finish", w.agent)}),
            )
        })
        .collect();
    coordinator_turns.push(Turn::text("All four answered."));
    let claude = Upstream::tcp(coordinator_turns).await;
    let mut workers = Vec::new();
    for worker in &WORKERS {
        workers.push((worker, Upstream::tcp(worker_turns(worker)).await));
    }
    let dir = tempfile::tempdir().unwrap();
    let mut routes = vec![clis::Route {
        provider: "claude",
        kind: "anthropic",
        model: COORDINATOR,
        url: claude.base_url(),
    }];
    routes.extend(workers.iter().map(|(w, upstream)| clis::Route {
        provider: w.agent,
        kind: clis::provider_kind(w.agent),
        model: w.model,
        url: upstream.base_url(),
    }));
    let config = clis::gateway_config(dir.path(), &routes);
    let pair = Pair::start_on(
        move |r| r.image = image,
        move |c| c.gateway_config = Some(config),
    )
    .await;
    let ws = pair.runner.workspace("vendors");
    pair.server
        .write_agent_text(Some(&ws), "claude", &clis::example("claude", COORDINATOR));
    for (worker, _) in &workers {
        pair.server.write_agent_text(
            Some(&ws),
            worker.agent,
            &clis::example(worker.agent, worker.model),
        );
    }
    let root = pair
        .server
        .operator()
        .await
        .create_root_session(pb::CreateRootSessionRequest {
            workspace_id: ws.clone(),
            trust_level: pb::TrustLevel::Direct as i32,
            title: "coordinator".into(),
            agent_name: "claude".into(),
            initial_message: "Hand each of the four workers its task.".into(),
            budget,
            ..Default::default()
        })
        .await
        .expect("create the coordinator")
        .into_inner()
        .session
        .unwrap();
    Some(Team {
        pair,
        claude,
        workers,
        root,
        _dir: dir,
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_team_of_five_vendors_hands_each_result_to_its_coordinator() {
    let Some(team) = start(None).await else {
        return;
    };
    let Team {
        pair,
        claude,
        workers,
        root,
        ..
    } = &team;
    // The coordinator's model is handed each worker's result.
    let deadline = tokio::time::Instant::now() + 4 * MINUTE;
    loop {
        let seen = claude.requests();
        let handed: Vec<Option<String>> = workers
            .iter()
            .map(|(w, _)| handed_result(&seen, &format!("toolu_{}", w.agent)))
            .collect();
        if handed.iter().all(Option::is_some) {
            for ((worker, _), got) in workers.iter().zip(handed) {
                assert_eq!(got.as_deref(), Some(worker.result), "{}", worker.agent);
            }
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the coordinator was not handed every result: {handed:?}; children: {:#?}",
            pair.get(&root.session_id).await.children
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }

    // Each worker ended completed with its result, its usage what its
    // upstream reported (10 input and 5 output tokens a call).
    let children = pair.get(&root.session_id).await.children;
    assert_eq!(children.len(), workers.len(), "{children:#?}");
    let mut total_calls = 0;
    let mut total_cost = 0;
    for (worker, upstream) in workers {
        let child = children
            .iter()
            .find(|c| c.agent_name == worker.agent)
            .unwrap_or_else(|| panic!("no {} child: {children:#?}", worker.agent));
        let got = pair
            .wait_status(&child.session_id, pb::SessionStatus::Completed)
            .await;
        let finished = got.result.clone().and_then(|r| r.finished);
        assert_eq!(
            finished.map(|f| f.result).as_deref(),
            Some(worker.result),
            "{}: {got:#?}",
            worker.agent
        );
        let calls = upstream.requests().len() as u64;
        assert!(calls >= 1, "{} called its model", worker.agent);
        let usage = got.session.unwrap().usage.unwrap();
        let tokens = usage.own_tokens.unwrap();
        // $2/M input and $8/M output (clis::gateway_config's prices), in
        // pico-dollars a token.
        assert_eq!(
            (
                usage.own_calls,
                tokens.input,
                tokens.output,
                usage.own_cost_pico_usd
            ),
            (
                calls,
                10 * calls,
                5 * calls,
                calls * (10 * 2_000_000 + 5 * 8_000_000)
            ),
            "{}'s usage",
            worker.agent
        );
        total_cost += usage.own_cost_pico_usd;
        total_calls += calls;
        // No key of the provider reached the container: the upstream saw
        // the gateway's, and the worker's own requests carried its token.
        for request in upstream.requests() {
            assert_eq!(request.api_key(), Some(clis::KEY), "{}", worker.agent);
        }
    }
    let root_now = pair.get(&root.session_id).await.session.unwrap();
    let usage = root_now.usage.unwrap();
    let coordinator_calls = claude.requests().len() as u64;
    assert_eq!(usage.own_calls, coordinator_calls);
    // $2/M input and $8/M output, as every model of the test.
    assert_eq!(
        usage.own_cost_pico_usd,
        coordinator_calls * (10 * 2_000_000 + 5 * 8_000_000)
    );
    total_calls += usage.own_calls;
    total_cost += usage.own_cost_pico_usd;
    assert_eq!(
        (
            usage.subtree_calls,
            usage.subtree_tokens,
            usage.subtree_cost_pico_usd
        ),
        (total_calls, 15 * total_calls, total_cost),
        "{usage:#?}"
    );
    pair.terminate(&root.session_id).await;
}

/// One tree budget of model calls stops the whole team exactly at it,
/// whichever vendor's CLI makes the call that reaches it: the upstreams
/// together answer that many calls and no more, the tree's usage counts
/// them, and the team's script is left unfinished.
#[tokio::test(flavor = "multi_thread")]
async fn one_tree_budget_stops_the_mixed_team_exactly_at_it() {
    const CALLS: u64 = 5;
    let budget = pb::Budget {
        model_calls: Some(CALLS),
        ..Default::default()
    };
    let Some(team) = start(Some(budget)).await else {
        return;
    };
    let usage = || async {
        let root = team.pair.get(&team.root.session_id).await.session.unwrap();
        root.usage.unwrap()
    };
    let deadline = tokio::time::Instant::now() + 3 * MINUTE;
    loop {
        let now = usage().await;
        if now.subtree_calls == CALLS && now.reserved_calls == 0 {
            break;
        }
        assert!(
            now.subtree_calls <= CALLS,
            "the tree went past its budget: {now:#?}"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "the team never spent its budget: {now:#?}, {} calls",
            team.calls()
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    // The CLIs go on trying (refused, some retry): nothing more gets through.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert_eq!(team.calls() as u64, CALLS);
    let now = usage().await;
    assert_eq!(now.subtree_calls, CALLS, "{now:#?}");
    assert_eq!(now.subtree_tokens, 15 * CALLS, "{now:#?}");
    let left = team.claude.turns_left()
        + team
            .workers
            .iter()
            .map(|(_, u)| u.turns_left())
            .sum::<usize>();
    assert!(left > 0, "the budget stopped nothing");
    team.pair.terminate(&team.root.session_id).await;
}
