//! OpenCode (`opencode run`): one run per message, its session continued
//! after the first (`-s ID`, the id its events carry). Its configuration
//! comes in `OPENCODE_CONFIG_CONTENT`: one provider, the gateway's Chat
//! Completions (`@ai-sdk/openai-compatible`, bundled with OpenCode, its key
//! read from `OPENAI_API_KEY`), the model for both its main and its small
//! calls, Troupe's MCP server, an agent `troupe` whose prompt is read from a
//! file (so nothing in it is taken for OpenCode's `{env:..}` or `{file:..}`),
//! sharing, updates, web fetch and its own sub-agents off; models.dev and
//! the update check stay unasked (`OPENCODE_DISABLE_MODELS_FETCH`,
//! `OPENCODE_DISABLE_AUTOUPDATE`). Each run is titled with the agent's name,
//! so OpenCode makes no call to title it. The message goes on stdin; its
//! JSON events (`--format json`) are the session's output.

use serde_json::{Value, json};
use tokio::process::Command;

use super::{
    context::{Context, write_private},
    turns::{Turn, TurnCli, plain_id},
};

#[derive(Default)]
pub(super) struct OpenCode {
    session: Option<String>,
    answer: String,
}

/// The configuration, as `OPENCODE_CONFIG_CONTENT`.
pub(super) fn config(ctx: &Context) -> Value {
    let model = format!("troupe/{}", ctx.model);
    json!({
        "provider": {"troupe": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "Troupe",
            "models": {ctx.model.as_str(): {}},
            "options": {"baseURL": ctx.openai_base_url, "apiKey": "{env:OPENAI_API_KEY}"},
        }},
        "model": model,
        "small_model": model,
        "autoupdate": false,
        "share": "disabled",
        "agent": {"troupe": {
            "mode": "primary",
            "prompt": format!("{{file:{}}}", ctx.file("prompt.md").display()),
        }},
        "default_agent": "troupe",
        "mcp": {"troupe": {
            "type": "local",
            "command": [ctx.mcp_command.to_string_lossy()],
            "enabled": true,
        }},
        "tools": {"webfetch": false, "task": false},
    })
}

impl TurnCli for OpenCode {
    fn prepare(&mut self, ctx: &Context) -> anyhow::Result<()> {
        write_private(&ctx.file("prompt.md"), &ctx.system_prompt())
    }

    fn turn(&mut self, ctx: &Context, message: &str) -> anyhow::Result<Turn> {
        let mut command = Command::new("opencode");
        command
            .env("OPENCODE_CONFIG_CONTENT", config(ctx).to_string())
            .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
            .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
            .args([
                "run",
                "--format",
                "json",
                "--auto",
                "--title",
                &ctx.session_id,
            ]);
        if let Some(session) = &self.session {
            command.args(["-s", session]);
        }
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
        if self.session.is_none()
            && let Some(id) = event["sessionID"].as_str().filter(|id| plain_id(id))
        {
            self.session = Some(id.to_owned());
        }
        match event["type"].as_str() {
            // A step's text is the answer so far; a later step's replaces it.
            Some("step_start") => self.answer.clear(),
            Some("text") => {
                if let Some(text) = event["part"]["text"].as_str() {
                    self.answer.push_str(text);
                }
            }
            _ => {}
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
    fn the_config_reads_its_prompt_from_a_file() {
        let mut ctx = context(Runtime::OpenCode, std::path::Path::new("/h"));
        ctx.prompt = "{env:TROUPE_SESSION_TOKEN}".into();
        let config = config(&ctx);
        assert_eq!(
            config["agent"]["troupe"]["prompt"],
            "{file:/h/.troupe/opencode/prompt.md}"
        );
        assert!(!config.to_string().contains("{env:TROUPE"), "{config}");
        assert_eq!(config["model"], "troupe/m-1");
        assert_eq!(
            config["provider"]["troupe"]["options"]["baseURL"],
            "http://127.0.0.1:4100/v1"
        );
    }

    #[test]
    fn it_continues_its_session_and_keeps_the_last_steps_text() {
        let ctx = context(Runtime::OpenCode, std::path::Path::new("/h"));
        let mut opencode = OpenCode::default();
        opencode.turn(&ctx, "task").unwrap();
        for line in [
            r#"{"type":"step_start","sessionID":"ses_1"}"#,
            r#"{"type":"text","sessionID":"ses_1","part":{"type":"text","text":"calling"}}"#,
            r#"{"type":"step_start","sessionID":"ses_1"}"#,
            r#"{"type":"text","sessionID":"ses_1","part":{"type":"text","text":"done"}}"#,
        ] {
            opencode.observe(line);
        }
        assert_eq!(opencode.answer(&ctx).as_deref(), Some("done"));
        let next = opencode.turn(&ctx, "more").unwrap();
        let args: Vec<_> = next.command.as_std().get_args().collect();
        assert_eq!(args[args.len() - 2..], ["-s", "ses_1"]);
    }
}
