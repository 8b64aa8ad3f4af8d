//! Gemini CLI (`gemini -p`): one run per message, the conversation resumed
//! after the first (`--session-id UUID`, then `--resume UUID`). Its
//! settings (`$HOME/.gemini/settings.json`) choose API-key auth (needed
//! headless when a base URL is set), turn off usage statistics, updates,
//! web search and fetch, and name Troupe's MCP server with the variables it
//! needs written as `$NAME` (Gemini CLI gives its servers a sanitised
//! environment, and expands those); the system prompt goes in
//! `$HOME/.gemini/GEMINI.md`, which Gemini CLI appends to its own. The
//! gateway is `GOOGLE_GEMINI_BASE_URL` (plain HTTP on 127.0.0.1, which it
//! accepts), the session's token `GEMINI_API_KEY`, the model always given
//! (`-m`: without it Gemini CLI routes to models of its own choosing). The
//! message goes on stdin; its `stream-json` events are the session's output.

use serde_json::{Map, Value, json};
use tokio::process::Command;
use troupe_proto::agent::env as agent_env;

use super::{
    context::{Context, write_private},
    turns::{Turn, TurnCli},
};

pub(super) struct Gemini {
    session: String,
    started: bool,
    answer: String,
}

impl Default for Gemini {
    fn default() -> Self {
        Gemini {
            session: uuid::Uuid::new_v4().to_string(),
            started: false,
            answer: String::new(),
        }
    }
}

/// The settings, as `settings.json`.
pub(super) fn settings(ctx: &Context) -> Value {
    let env: Map<String, Value> = ctx
        .forwarded
        .iter()
        .map(|name| (name.clone(), Value::from(format!("${name}"))))
        .collect();
    json!({
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": false},
        "general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false},
        "tools": {"exclude": ["google_web_search", "web_fetch"]},
        "mcpServers": {"troupe": {
            "command": ctx.mcp_command.to_string_lossy(),
            "args": [],
            "trust": true,
            "env": env,
        }},
    })
}

impl TurnCli for Gemini {
    fn prepare(&mut self, ctx: &Context) -> anyhow::Result<()> {
        let dir = ctx.home.join(".gemini");
        write_private(
            &dir.join("settings.json"),
            &serde_json::to_string_pretty(&settings(ctx))?,
        )?;
        write_private(&dir.join("GEMINI.md"), &ctx.system_prompt())
    }

    fn turn(&mut self, ctx: &Context, message: &str) -> anyhow::Result<Turn> {
        let token = std::env::var(agent_env::SESSION_TOKEN).unwrap_or_default();
        let mut command = Command::new("gemini");
        command
            .env("GOOGLE_GEMINI_BASE_URL", &ctx.base_url)
            .env("GEMINI_API_KEY", token)
            .args(["-p", "", "-m", &ctx.model, "--skip-trust"])
            .args(["--approval-mode", "yolo", "--output-format", "stream-json"])
            .arg(if self.started {
                "--resume"
            } else {
                "--session-id"
            })
            .arg(&self.session);
        self.started = true;
        self.answer.clear();
        Ok(Turn {
            command,
            stdin: Some(message.to_owned()),
        })
    }

    fn observe(&mut self, line: &str) {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            return;
        };
        if event["type"] == "message" && event["role"] == "assistant" {
            if event["delta"] != true {
                self.answer.clear();
            }
            if let Some(text) = event["content"].as_str() {
                self.answer.push_str(text);
            }
        }
    }

    fn answer(&mut self, _ctx: &Context) -> Option<String> {
        (!self.answer.is_empty()).then(|| std::mem::take(&mut self.answer))
    }
}

#[cfg(test)]
mod tests {
    use troupe_proto::agent::Runtime;

    use super::*;
    use crate::agent::context::tests::context;

    #[test]
    fn the_settings_pass_the_bridge_its_variables_by_name() {
        let ctx = context(Runtime::GeminiCli, std::path::Path::new("/h"));
        let settings = settings(&ctx);
        assert_eq!(
            settings["mcpServers"]["troupe"]["env"],
            json!({"TROUPE_SESSION_ENDPOINT": "$TROUPE_SESSION_ENDPOINT",
                   "TROUPE_SESSION_TOKEN": "$TROUPE_SESSION_TOKEN"})
        );
        assert_eq!(
            settings["security"]["auth"]["selectedType"],
            "gemini-api-key"
        );
    }

    #[test]
    fn it_resumes_its_session_and_joins_the_answers_deltas() {
        let ctx = context(Runtime::GeminiCli, std::path::Path::new("/h"));
        let mut gemini = Gemini::default();
        let id = gemini.session.clone();
        let first = gemini.turn(&ctx, "task").unwrap();
        let args: Vec<_> = first.command.as_std().get_args().collect();
        assert_eq!(&args[..4], ["-p", "", "-m", "m-1"]);
        assert_eq!(args[args.len() - 2..], ["--session-id", id.as_str()]);
        for line in [
            r#"{"type":"message","role":"user","content":"task"}"#,
            r#"{"type":"message","role":"assistant","content":"PO","delta":true}"#,
            r#"{"type":"message","role":"assistant","content":"NG","delta":true}"#,
        ] {
            gemini.observe(line);
        }
        assert_eq!(gemini.answer(&ctx).as_deref(), Some("PONG"));
        let next = gemini.turn(&ctx, "more").unwrap();
        let args: Vec<_> = next.command.as_std().get_args().collect();
        assert_eq!(args[args.len() - 2..], ["--resume", id.as_str()]);
        assert_eq!(gemini.answer(&ctx), None);
    }
}
