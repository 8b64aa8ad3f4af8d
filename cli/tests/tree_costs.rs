//! `troupe session tree` against a real session service whose gateway
//! meters calls to the scripted upstream: each session's line shows its own
//! cost and tokens and its subtree's, exactly as metered, and `--json` has
//! the same figures.

use std::process::{Command, Output};

use serde_json::Value;
use troupe_proto::money;
use troupe_tests::{
    OPERATOR_TOKEN, child, create_child,
    gateway::{Setup, USAGE, USAGE_COST, settled},
    upstream::{Turn, Usage},
};

const TROUPE: &str = env!("CARGO_BIN_EXE_troupe");

/// 100 input tokens at $3/M and 50 output at $15/M: $0.00105.
const SMALL: Usage = Usage {
    input_tokens: 100,
    output_tokens: 50,
    cache_read_input_tokens: 0,
    cache_creation_input_tokens: 0,
};
const SMALL_COST: u64 = 100 * 3_000_000 + 50 * 15_000_000;
const USAGE_TOKENS: u64 = 1_234 + 567 + 10_000 + 2_000;

async fn tree(setup: &Setup, data: &std::path::Path, id: &str, json: bool) -> String {
    let mut command = Command::new(TROUPE);
    command
        .env("TROUPE_ENDPOINT", format!("http://{}", setup.server.addr))
        .env("TROUPE_OPERATOR_TOKEN", OPERATOR_TOKEN)
        .env("TROUPE_DATA_DIR", data)
        .env_remove("TROUPE_TOKEN");
    if json {
        command.arg("--json");
    }
    command.args(["session", "tree", id]);
    let output: Output = tokio::task::spawn_blocking(move || command.output().expect("runs"))
        .await
        .expect("joined");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "troupe failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The figures on `id`'s line: own cost and tokens, subtree cost and tokens.
fn figures<'a>(text: &'a str, id: &str) -> (&'a str, &'a str, &'a str, &'a str) {
    let line = text
        .lines()
        .find(|l| l.split_whitespace().any(|w| w == id))
        .unwrap_or_else(|| panic!("no line of {id} in\n{text}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let own = words
        .iter()
        .rposition(|w| *w == "own")
        .unwrap_or_else(|| panic!("no costs on {line:?}"));
    assert_eq!(
        (words[own + 3], words[own + 4], words.get(own + 7)),
        ("tok", "subtree", Some(&"tok")),
        "{line:?}"
    );
    (
        words[own + 1],
        words[own + 2],
        words[own + 5],
        words[own + 6],
    )
}

fn usd(pico: u64) -> String {
    format!("${}", money::usd(pico))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_tree_shows_each_sessions_own_and_subtree_cost_as_metered() {
    let setup = Setup::new(vec![
        Turn::text("root's").with_usage(USAGE),
        Turn::text("child's").with_usage(SMALL),
    ])
    .await;
    let data = tempfile::tempdir().expect("dir");
    let (root, root_token) = setup.root("alpha", None).await;
    let mut agent = setup.server.client(Some(&root_token)).await;
    let kid = create_child(&mut agent, child("worker")).await.session_id;
    let kid_token = setup.server.token_for(&kid).await;
    let mut kid_agent = setup.server.client(Some(&kid_token)).await;
    let grandchild = create_child(&mut kid_agent, child("worker"))
        .await
        .session_id;
    for token in [&root_token, &kid_token] {
        let answer = setup.call(token, false).await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    let metered = settled(&setup, &root).await;
    assert_eq!(metered.own_cost_pico_usd, USAGE_COST);
    assert_eq!(metered.subtree_cost_pico_usd, USAGE_COST + SMALL_COST);

    let text = tree(&setup, data.path(), &grandchild, false).await;
    let root_usd = usd(USAGE_COST);
    let tree_usd = usd(USAGE_COST + SMALL_COST);
    let kid_usd = usd(SMALL_COST);
    assert_eq!(
        (root_usd.as_str(), tree_usd.as_str()),
        ("$0.022707", "$0.023757")
    );
    let (root_tokens, tree_tokens) = (USAGE_TOKENS.to_string(), (USAGE_TOKENS + 150).to_string());
    assert_eq!(
        figures(&text, &root),
        (
            root_usd.as_str(),
            root_tokens.as_str(),
            tree_usd.as_str(),
            tree_tokens.as_str()
        ),
        "{text}"
    );
    assert_eq!(
        figures(&text, &kid),
        (kid_usd.as_str(), "150", kid_usd.as_str(), "150"),
        "{text}"
    );
    assert_eq!(
        figures(&text, &grandchild),
        ("$0.00", "0", "$0.00", "0"),
        "{text}"
    );
    // The columns line up: every "own" and every "subtree" at one place.
    for word in [" own ", " subtree "] {
        let at: Vec<usize> = text
            .lines()
            .map(|l| l[..l.find(word).expect(word)].chars().count())
            .collect();
        assert!(
            at.windows(2).all(|w| w[0] == w[1]),
            "{word}: {at:?}\n{text}"
        );
    }

    let json: Value =
        serde_json::from_str(&tree(&setup, data.path(), &grandchild, true).await).expect("JSON");
    assert_eq!(json["session_id"], root.as_str(), "{json}");
    let usage = &json["usage"];
    assert_eq!(usage["own"]["cost_pico_usd"], USAGE_COST, "{json}");
    assert_eq!(usage["own"]["cost_usd"], "0.022707");
    assert_eq!(usage["subtree"]["cost_usd"], "0.023757");
    assert_eq!(usage["subtree"]["tokens"], USAGE_TOKENS + 150);
    let kid_json = &json["children"][0];
    assert_eq!(kid_json["session_id"], kid.as_str());
    assert_eq!(kid_json["usage"]["own"]["cost_pico_usd"], SMALL_COST);
    assert_eq!(kid_json["usage"]["own"]["input_tokens"], 100);
    assert_eq!(
        kid_json["children"][0]["usage"]["subtree"]["cost_pico_usd"],
        0
    );
}
