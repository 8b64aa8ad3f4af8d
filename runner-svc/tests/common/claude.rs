//! The real Claude Code as a Troupe agent behind the model gateway: the
//! example agent definition with the model variables set, and a gateway
//! configuration whose one provider is the scripted upstream.

use std::path::{Path, PathBuf};

use super::pair::Pair;

/// $3/M input, $15/M output, $0.30/M cache read, $3.75/M cache write, in
/// pico-dollars per token.
pub const PRICE: [u64; 4] = [3_000_000, 15_000_000, 300_000, 3_750_000];

/// `examples/agents/claude.md`, its model `model` (also for Claude Code's
/// small calls) and each of `env` added to its `env`.
pub fn claude_agent(model: &str, env: &[(&str, &str)]) -> String {
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents/claude.md"),
    )
    .expect("examples/agents/claude.md");
    let extra: String = env
        .iter()
        .map(|(name, value)| format!("  {name}: \"{value}\"\n"))
        .collect();
    super::clis::with_model(&example, model).replacen(
        "\ndescription:",
        &format!("\nenv:\n  ANTHROPIC_SMALL_FAST_MODEL: {model}\n{extra}description:"),
        1,
    )
}

/// Writes `key` and a gateway configuration to `dir`: one Anthropic
/// provider, `scripted`, at `upstream`, pricing `model` at [`PRICE`].
pub fn gateway_config(dir: &Path, upstream: &str, key: &str, model: &str) -> PathBuf {
    gateway_config_priced(
        dir,
        upstream,
        key,
        model,
        r#"{ input: "3", output: "15", cache_read: "0.30", cache_write: "3.75" }"#,
    )
}

/// As [`gateway_config`], pricing `model` at `prices` (the YAML map of its
/// dollars per million tokens).
pub fn gateway_config_priced(
    dir: &Path,
    upstream: &str,
    key: &str,
    model: &str,
    prices: &str,
) -> PathBuf {
    let key_file = dir.join("key");
    std::fs::write(&key_file, key).unwrap();
    let file = dir.join("gateway.yaml");
    std::fs::write(
        &file,
        format!(
            "providers:\n  scripted:\n    kind: anthropic\n    base_url: {upstream}\n    \
             key_file: {}\n    models:\n      {model}: {prices}\n",
            key_file.display()
        ),
    )
    .unwrap();
    file
}

/// A pair whose runner runs the Claude Code image and whose session
/// service's gateway sends `model` to `upstream` with `key`, and a
/// workspace whose `claude` agent is [`claude_agent`] with `env`.
pub struct Team {
    pub pair: Pair,
    pub ws: String,
    /// Holds the gateway's configuration and key file.
    pub dir: tempfile::TempDir,
}

/// Starts a [`Team`]; `None` when the Claude Code image cannot be built
/// (the npm registry is unreachable).
pub async fn team(
    upstream: &str,
    key: &str,
    model: &str,
    workspace: &str,
    env: &[(&str, &str)],
) -> Option<Team> {
    let image = tokio::task::spawn_blocking(claude_image).await.unwrap()?;
    let dir = tempfile::tempdir().unwrap();
    let config = gateway_config(dir.path(), upstream, key, model);
    let pair = Pair::start_on(
        move |r| r.image = image,
        move |c| c.gateway_config = Some(config),
    )
    .await;
    let ws = pair.runner.workspace(workspace);
    pair.server
        .write_agent_text(Some(&ws), "claude", &claude_agent(model, env));
    Some(Team { pair, ws, dir })
}

/// The image of the agent CLIs ([`super::clis::agents_image`]), when it
/// holds Claude Code; `None` (its tests say they are skipped) when npm could
/// not be reached.
pub fn claude_image() -> Option<String> {
    let (image, clis) = super::clis::agents_image()?;
    if clis.iter().any(|cli| cli == "claude-code") {
        Some(image)
    } else {
        eprintln!("SKIPPED: the agent CLIs image holds no Claude Code (npm unreachable)");
        None
    }
}
