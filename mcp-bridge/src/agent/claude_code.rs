//! Claude Code (`claude -p`): one process for the whole session, which
//! takes each message as it comes, even mid-turn (`--input-format
//! stream-json`: Troupe's message lines turned into its user messages,
//! [`crate::claude`]). Troupe's MCP server comes from a file
//! (`--mcp-config`, `--strict-mcp-config`: no other server), its tools are
//! allowed by name, and the system prompt is appended to Claude Code's own
//! from a file (`--append-system-prompt-file`), so nothing of the session
//! is on the command line. Its small calls use the same model unless the
//! definition's `env` says otherwise. Its stream-json events are the
//! session's output.

use std::process::{Command, Stdio};

use anyhow::Context as _;
use serde_json::json;

use super::{
    context::{Context, TOOLS, write_private},
    turns::exit_code,
};
use crate::claude;

/// The variables naming the model of Claude Code's small calls.
const SMALL_MODEL_VARS: [&str; 2] = [
    "ANTHROPIC_SMALL_FAST_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
];

/// The MCP configuration, as `--mcp-config` reads it.
pub(super) fn mcp_config(ctx: &Context) -> serde_json::Value {
    json!({"mcpServers": {"troupe": {
        "command": ctx.mcp_command.to_string_lossy(),
        "args": [],
    }}})
}

/// The command line, after `claude`.
pub(super) fn args(ctx: &Context) -> Vec<String> {
    let allowed = TOOLS.map(|tool| format!("mcp__troupe__{tool}")).join(",");
    [
        "-p",
        "--input-format",
        "stream-json",
        "--output-format",
        "stream-json",
        "--verbose",
        "--strict-mcp-config",
        "--mcp-config",
    ]
    .map(str::to_owned)
    .into_iter()
    .chain([ctx.file("mcp.json").to_string_lossy().into_owned()])
    .chain(["--allowedTools".to_owned(), allowed])
    .chain(["--append-system-prompt-file".to_owned()])
    .chain([ctx.file("prompt.md").to_string_lossy().into_owned()])
    .chain(["--model".to_owned(), ctx.model.clone()])
    .collect()
}

/// Runs Claude Code until Troupe's stdin ends and Claude Code exits.
pub(super) async fn run(ctx: &Context) -> anyhow::Result<i32> {
    write_private(&ctx.file("mcp.json"), &mcp_config(ctx).to_string())?;
    write_private(&ctx.file("prompt.md"), &ctx.system_prompt())?;
    let mut command = Command::new("claude");
    // Its small, background calls go to the same model, unless the
    // definition's `env` names another.
    for name in SMALL_MODEL_VARS {
        if std::env::var_os(name).is_none() {
            command.env(name, &ctx.model);
        }
    }
    let mut child = command
        .args(args(ctx))
        .stdin(Stdio::piped())
        .spawn()
        .context("cannot start claude (is it on PATH in the image?)")?;
    let input = child.stdin.take().context("claude's stdin")?;
    tokio::task::spawn_blocking(move || {
        // Claude Code gone, the write fails and the forwarding ends.
        let _ = claude::forward(std::io::stdin().lock(), input);
    });
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .context("the wait for claude failed")??;
    Ok(exit_code(status))
}

#[cfg(test)]
mod tests {
    use troupe_proto::agent::Runtime;

    use super::*;
    use crate::agent::context::tests::context;

    #[test]
    fn the_command_line_names_files_not_the_session() {
        let ctx = context(Runtime::ClaudeCode, std::path::Path::new("/h"));
        let args = args(&ctx);
        let value = |flag: &str| {
            let at = args.iter().position(|a| a == flag).unwrap();
            args[at + 1].as_str()
        };
        assert_eq!(value("--input-format"), "stream-json");
        assert_eq!(value("--mcp-config"), "/h/.troupe/claude-code/mcp.json");
        assert_eq!(
            value("--append-system-prompt-file"),
            "/h/.troupe/claude-code/prompt.md"
        );
        assert_eq!(value("--model"), "m-1");
        let allowed: Vec<&str> = value("--allowedTools").split(',').collect();
        assert_eq!(allowed.len(), 14);
        assert!(allowed.contains(&"mcp__troupe__finish"));
        assert!(!args.join(" ").contains("sess_a"), "{args:?}");
        assert_eq!(
            mcp_config(&ctx),
            json!({"mcpServers": {"troupe": {"command": "/opt/troupe/bin/troupe-mcp", "args": []}}})
        );
    }
}
