//! The real Claude Code, as a team, through the session service's model
//! gateway: each agent in the agent CLIs image (network `none`, no
//! provider key in the container) calls its model at `ANTHROPIC_BASE_URL`
//! with its session's token; the gateway sends each call to the scripted
//! upstream with the provider's key and meters it on the caller's session
//! and its tree, from the usage the upstream reported.

use crate::common;

use std::time::Duration;

use common::{
    claude::{self, PRICE, Team},
    *,
};
use serde_json::json;
use troupe_proto::session as pb;
use troupe_tests::upstream::{Turn, Upstream, Usage};

const KEY: &str = "sk-ant-team-provider-key-not-in-containers";
const MODEL: &str = "claude-team-test";
const COORDINATOR: &str = "COORDINATE-7f3e";
const WORKER: &str = "WORK-9c1a";

fn usage(input: u64, output: u64, read: u64, write: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cache_read_input_tokens: read,
        cache_creation_input_tokens: write,
    }
}

fn cost(u: &[Usage]) -> u64 {
    u.iter()
        .map(|u| {
            u.input_tokens * PRICE[0]
                + u.output_tokens * PRICE[1]
                + u.cache_read_input_tokens * PRICE[2]
                + u.cache_creation_input_tokens * PRICE[3]
        })
        .sum()
}

fn tokens(u: &[Usage]) -> [u64; 4] {
    u.iter().fold([0; 4], |t, u| {
        [
            t[0] + u.input_tokens,
            t[1] + u.output_tokens,
            t[2] + u.cache_read_input_tokens,
            t[3] + u.cache_creation_input_tokens,
        ]
    })
}

/// A coordinator (the real Claude Code) spawns a worker (the real Claude
/// Code) with `mcp__troupe__create_session`; the worker answers with
/// `mcp__troupe__send_message`; the coordinator reads the answer. Every call
/// went upstream with the provider's key only, and the metered usage of
/// each session and of the tree is the scripted usage to the token, and the
/// price table's cost to the pico-dollar.
#[tokio::test]
async fn a_claude_code_team_is_metered_to_the_token_and_the_cent() {
    let upstream = Upstream::tcp(vec![]).await;
    let Some(Team {
        pair,
        ws,
        dir: _dir,
    }) = claude::team(&upstream.base_url(), KEY, MODEL, "team", &[]).await
    else {
        return;
    };

    let coordinator = [
        usage(1_500, 40, 0, 900),
        usage(1_700, 12, 900, 0),
        usage(1_900, 9, 900, 0),
    ];
    let worker = [usage(1_200, 30, 0, 0), usage(1_300, 7, 0, 0)];
    upstream.script(
        COORDINATOR,
        vec![
            Turn::tool_use(
                "toolu_spawn",
                "mcp__troupe__create_session",
                json!({"title": "worker", "agent_name": "claude",
                       "initial_message": format!("{WORKER}: what is six times seven? Answer me with send_message.")}),
            )
            .with_usage(coordinator[0]),
            Turn::text("I asked a worker.").with_usage(coordinator[1]),
            Turn::text("The worker says 42.").with_usage(coordinator[2]),
        ],
    );
    let root = pair
        .root(
            &ws,
            "claude",
            &format!("{COORDINATOR}: find out six times seven"),
        )
        .await;
    upstream.script(
        WORKER,
        vec![
            Turn::tool_use(
                "toolu_answer",
                "mcp__troupe__send_message",
                json!({"session_id": root.session_id, "message": "42"}),
            )
            .with_usage(worker[0]),
            Turn::text("Answered.").with_usage(worker[1]),
        ],
    );

    // Every scripted turn given, and every call settled.
    let deadline = tokio::time::Instant::now() + 3 * MINUTE;
    let (tree, child) = loop {
        let tree = pair.usage(&root.session_id).await;
        let children = pair.get(&root.session_id).await.children;
        if upstream.turns_left() == 0 && tree.subtree_calls == 5 && tree.reserved_calls == 0 {
            break (tree, children[0].session_id.clone());
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "turns left {}, usage {tree:?}, requests {:#?}, root output {:?}",
            upstream.turns_left(),
            upstream.requests(),
            pair.get(&root.session_id)
                .await
                .result
                .map(|r| r.output_tail)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let seen = upstream.requests();
    assert_eq!(seen.len(), 5, "{seen:#?}");
    for request in &seen {
        assert_eq!(request.api_key(), Some(KEY), "{request:#?}");
        assert_eq!(request.header("authorization"), None);
        assert_eq!(request.body["model"], MODEL);
    }
    let own = tree.own_tokens.unwrap();
    assert_eq!(
        [own.input, own.output, own.cache_read, own.cache_write],
        tokens(&coordinator)
    );
    assert_eq!(tree.own_calls, 3);
    assert_eq!(tree.own_cost_pico_usd, cost(&coordinator));
    let all: Vec<Usage> = coordinator.iter().chain(&worker).copied().collect();
    assert_eq!(tree.subtree_cost_pico_usd, cost(&all));
    assert_eq!(tree.subtree_tokens, tokens(&all).iter().sum::<u64>());
    let worker_usage = pair.usage(&child).await;
    let own = worker_usage.own_tokens.unwrap();
    assert_eq!(
        [own.input, own.output, own.cache_read, own.cache_write],
        tokens(&worker)
    );
    assert_eq!(worker_usage.own_cost_pico_usd, cost(&worker));
    // $0.0198+... to the cent and below: the exact pico-dollars.
    assert_eq!(
        cost(&all),
        (1_500 + 1_700 + 1_900 + 1_200 + 1_300) * PRICE[0]
            + (40 + 12 + 9 + 30 + 7) * PRICE[1]
            + 1_800 * PRICE[2]
            + 900 * PRICE[3]
    );
    pair.terminate(&root.session_id).await;
}

const RUNAWAY: &str = "SPAWN-FOREVER-51d2";

/// A runaway spawner: the scripted model keeps calling `create_session`.
/// With a budget of four model calls, exactly four reach the upstream; the
/// children of the first three are made, and the fourth's create is refused
/// BUDGET_EXCEEDED (the calls are spent); the fifth call is refused before
/// the upstream, in Anthropic's shape, which Claude Code prints. Both
/// refusals are audited.
#[tokio::test]
async fn a_runaway_claude_code_spawner_stops_exactly_at_its_budget() {
    let upstream = Upstream::tcp(vec![]).await;
    let Some(Team {
        pair,
        ws,
        dir: _dir,
    }) = claude::team(&upstream.base_url(), KEY, MODEL, "runaway", &[]).await
    else {
        return;
    };
    pair.agent(&ws, "sleeper", "cat");
    let turns = (0..8)
        .map(|i| {
            Turn::tool_use(
                &format!("toolu_{i}"),
                "mcp__troupe__create_session",
                json!({"title": format!("child {i}"), "agent_name": "sleeper",
                       "initial_message": "wait"}),
            )
        })
        .collect();
    upstream.script(RUNAWAY, turns);
    let root = pair
        .server
        .operator()
        .await
        .create_root_session(pb::CreateRootSessionRequest {
            workspace_id: ws.clone(),
            trust_level: pb::TrustLevel::Direct as i32,
            agent_name: "claude".into(),
            initial_message: format!("{RUNAWAY}: spawn"),
            budget: Some(pb::Budget {
                model_calls: Some(4),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("root")
        .into_inner()
        .session
        .unwrap();
    // The gateway's refusal of the fifth call, as Claude Code prints it.
    let refusal = format!(
        "budget exceeded: session {}'s model_calls budget is 4, 4 is used or reserved",
        root.session_id
    );
    let tail = pair
        .tail_within(&root.session_id, &refusal, 3 * MINUTE, || {
            format!("\nrequests {:#?}", upstream.requests())
        })
        .await;
    assert!(!tail.contains(KEY));
    assert_eq!(upstream.requests().len(), 4);
    assert_eq!(upstream.turns_left(), 4);
    let usage = pair.usage(&root.session_id).await;
    assert_eq!(
        (usage.subtree_calls, usage.reserved_calls),
        (4, 0),
        "{usage:?}"
    );
    assert_eq!(pair.get(&root.session_id).await.children.len(), 3);
    let audit = pair
        .server
        .operator()
        .await
        .list_audit(pb::ListAuditRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        audit.entries.iter().any(|e| e.action == "model_call"
            && !e.allowed
            && e.reason == "BUDGET_EXCEEDED"
            && e.target == root.session_id),
        "{:#?}",
        audit.entries
    );
    assert!(
        audit
            .entries
            .iter()
            .any(|e| e.action == "create_session" && !e.allowed && e.reason == "BUDGET_EXCEEDED"),
        "{:#?}",
        audit.entries
    );
    pair.terminate(&root.session_id).await;
}
