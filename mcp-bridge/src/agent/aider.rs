//! Aider: no MCP client and no JSON output, so a leaf worker. Each message
//! is one run (`--message-file`), the chat restored from its history file
//! after the first (`--restore-chat-history`); once no message waits, its
//! last answer, read from that history, is the session's result
//! ([`super::turns`]). The system prompt is a read-only file in the chat
//! (`--read`); the gateway comes in `AIDER_OPENAI_API_BASE` and the key is
//! `OPENAI_API_KEY`, as every agent has it (never on the command line);
//! a model-metadata file keeps it from fetching LiteLLM's price list, and
//! git, update checks, analytics and release notes are off.

use serde_json::json;
use tokio::process::Command;

use super::{
    context::{Context, write_private},
    turns::{Turn, TurnCli},
};

#[derive(Default)]
pub(super) struct Aider {
    turns: u64,
}

impl TurnCli for Aider {
    fn prepare(&mut self, ctx: &Context) -> anyhow::Result<()> {
        write_private(&ctx.file("prompt.md"), &ctx.system_prompt())?;
        let metadata = json!({ format!("openai/{}", ctx.model): {
            "max_input_tokens": 200_000,
            "max_output_tokens": 32_000,
            "input_cost_per_token": 0,
            "output_cost_per_token": 0,
            "litellm_provider": "openai",
            "mode": "chat",
        }});
        write_private(&ctx.file("model-metadata.json"), &metadata.to_string())
    }

    fn turn(&mut self, ctx: &Context, message: &str) -> anyhow::Result<Turn> {
        let message_file = ctx.file("message.txt");
        write_private(&message_file, message)?;
        let mut command = Command::new("aider");
        command
            .env("AIDER_OPENAI_API_BASE", &ctx.openai_base_url)
            .arg("--model")
            .arg(format!("openai/{}", ctx.model))
            .arg("--model-metadata-file")
            .arg(ctx.file("model-metadata.json"))
            .arg("--read")
            .arg(ctx.file("prompt.md"))
            .arg("--message-file")
            .arg(&message_file)
            .arg("--chat-history-file")
            .arg(ctx.file("history.md"))
            .arg("--input-history-file")
            .arg(ctx.file("input.history"))
            .args([
                "--yes-always",
                "--no-git",
                "--no-check-update",
                "--analytics-disable",
                "--no-show-release-notes",
                "--no-show-model-warnings",
                "--no-pretty",
                "--no-stream",
            ]);
        if self.turns > 0 {
            command.arg("--restore-chat-history");
        }
        self.turns += 1;
        Ok(Turn {
            command,
            stdin: None,
        })
    }

    fn observe(&mut self, _line: &str) {}

    fn answer(&mut self, ctx: &Context) -> Option<String> {
        last_answer(&std::fs::read_to_string(ctx.file("history.md")).ok()?)
    }
}

/// The last answer of an Aider chat history: the lines after the last
/// block of `#### ` lines (the user's message), up to the next `> ` line
/// (Aider's own notes) or message.
pub(super) fn last_answer(history: &str) -> Option<String> {
    let lines: Vec<&str> = history.lines().collect();
    let last_ask = lines.iter().rposition(|l| l.starts_with("#### "))?;
    let answer: Vec<&str> = lines[last_ask + 1..]
        .iter()
        .take_while(|l| !l.starts_with("> ") && !l.starts_with("#### "))
        .copied()
        .collect();
    let text = answer.join("\n").trim().to_owned();
    (!text.is_empty()).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_answer_is_read_from_the_history() {
        let history = "\n# aider chat started at 2026-11-28\n\n> Aider v0.86.2\n\n#### first task  \n\nPONG-1\n\n> Tokens: 11 sent, 7 received.  \n\n#### Message 2 from operator:  \n#### second  \n\nLine one\n\nLine two\n\n> Tokens: 20 sent, 9 received.  \n";
        assert_eq!(
            last_answer(history).as_deref(),
            Some("Line one\n\nLine two")
        );
        assert_eq!(last_answer("> only notes\n"), None);
        assert_eq!(last_answer("#### asked  \n\n> Tokens: 1\n"), None);
    }
}
