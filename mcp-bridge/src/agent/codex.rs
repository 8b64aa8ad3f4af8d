//! Codex (`codex exec`): one run per message, the thread resumed after the
//! first (`codex exec resume THREAD`). Its configuration
//! (`$CODEX_HOME/config.toml`) names the gateway as its only provider
//! (Responses, no WebSocket, no retries of a refused call), Troupe's MCP
//! server with the variables it needs passed on by name (`env_vars`: Codex
//! gives its servers a trimmed environment), approvals off and no sandbox
//! of its own (the container and the session's write scope are the
//! sandbox), plugins, analytics, web search and update checks off, so it
//! calls nothing but its model; the system prompt is its
//! `developer_instructions`. The message goes on stdin (`-`), never on the
//! command line. Its JSON events (`--json`) are the session's output.

use tokio::process::Command;

use super::{
    context::{Context, write_private},
    turns::{Turn, TurnCli, plain_id},
};

#[derive(Default)]
pub(super) struct Codex {
    thread: Option<String>,
    answer: Option<String>,
}

impl Codex {
    fn home(ctx: &Context) -> std::path::PathBuf {
        ctx.home.join(".codex")
    }
}

/// `text` as a TOML basic string: JSON's escapes are TOML's, and DEL, which
/// JSON leaves as it is, must be escaped in TOML.
fn toml_string(text: &str) -> String {
    serde_json::Value::from(text)
        .to_string()
        .replace('\u{7f}', "\\u007F")
}

/// The configuration, as `config.toml`.
pub(super) fn config(ctx: &Context) -> String {
    let env_vars = ctx
        .forwarded
        .iter()
        .map(|name| toml_string(name))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"model = {model}
model_provider = "troupe"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
web_search = "disabled"
developer_instructions = {instructions}

[analytics]
enabled = false

[features]
plugins = false

[model_providers.troupe]
name = "Troupe"
base_url = {base_url}
env_key = "OPENAI_API_KEY"
wire_api = "responses"
supports_websockets = false
request_max_retries = 0
stream_max_retries = 0

[mcp_servers.troupe]
command = {mcp}
args = []
env_vars = [{env_vars}]
"#,
        model = toml_string(&ctx.model),
        instructions = toml_string(&ctx.system_prompt()),
        base_url = toml_string(&ctx.openai_base_url),
        mcp = toml_string(&ctx.mcp_command.to_string_lossy()),
    )
}

impl TurnCli for Codex {
    fn prepare(&mut self, ctx: &Context) -> anyhow::Result<()> {
        write_private(&Codex::home(ctx).join("config.toml"), &config(ctx))
    }

    fn turn(&mut self, ctx: &Context, message: &str) -> anyhow::Result<Turn> {
        let mut command = Command::new("codex");
        command.env("CODEX_HOME", Codex::home(ctx)).arg("exec");
        if let Some(thread) = &self.thread {
            command.args(["resume", thread]);
        }
        command.args(["--json", "--skip-git-repo-check", "-"]);
        self.answer = None;
        Ok(Turn {
            command,
            stdin: Some(message.to_owned()),
        })
    }

    fn observe(&mut self, line: &str) {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            return;
        };
        match event["type"].as_str() {
            Some("thread.started") => {
                if let Some(id) = event["thread_id"].as_str().filter(|id| plain_id(id)) {
                    self.thread = Some(id.to_owned());
                }
            }
            Some("item.completed") if event["item"]["type"] == "agent_message" => {
                if let Some(text) = event["item"]["text"].as_str() {
                    self.answer = Some(text.to_owned());
                }
            }
            _ => {}
        }
    }

    fn answer(&mut self, _ctx: &Context) -> Option<String> {
        self.answer.take()
    }
}

#[cfg(test)]
mod tests {
    use troupe_proto::agent::Runtime;

    use super::*;
    use crate::agent::context::tests::context;

    #[test]
    fn the_config_names_the_gateway_the_bridge_and_the_prompt() {
        let mut ctx = context(Runtime::Codex, std::path::Path::new("/h"));
        ctx.prompt = "Quote \" backslash \\ newline\n tab\t del\u{7f} end".into();
        let text = config(&ctx);
        assert!(text.contains("model = \"m-1\"\n"), "{text}");
        assert!(
            text.contains("base_url = \"http://127.0.0.1:4100/v1\""),
            "{text}"
        );
        assert!(
            text.contains("command = \"/opt/troupe/bin/troupe-mcp\""),
            "{text}"
        );
        assert!(
            text.contains("env_vars = [\"TROUPE_SESSION_ENDPOINT\", \"TROUPE_SESSION_TOKEN\"]"),
            "{text}"
        );
        let line = text
            .lines()
            .find(|l| l.starts_with("developer_instructions = "))
            .unwrap();
        assert!(
            line.contains(
                r#"Quote \" backslash \\ newline\n tab\t del\u007F end\n\nYou are a member"#
            ),
            "{line}"
        );
    }

    #[test]
    fn it_follows_the_thread_and_the_last_answer() {
        let ctx = context(Runtime::Codex, std::path::Path::new("/h"));
        let mut codex = Codex::default();
        let first = codex.turn(&ctx, "task").unwrap();
        let args: Vec<_> = first.command.as_std().get_args().collect();
        assert_eq!(args, ["exec", "--json", "--skip-git-repo-check", "-"]);
        assert_eq!(first.stdin.as_deref(), Some("task"));
        for line in [
            r#"{"type":"thread.started","thread_id":"0199-abc"}"#,
            r#"{"type":"item.completed","item":{"type":"agent_message","text":"first"}}"#,
            r#"{"type":"item.completed","item":{"type":"reasoning","text":"no"}}"#,
            r#"{"type":"item.completed","item":{"type":"agent_message","text":"done"}}"#,
            "not json",
        ] {
            codex.observe(line);
        }
        assert_eq!(codex.answer(&ctx).as_deref(), Some("done"));
        let next = codex.turn(&ctx, "more").unwrap();
        let args: Vec<_> = next.command.as_std().get_args().collect();
        assert_eq!(
            args,
            [
                "exec",
                "resume",
                "0199-abc",
                "--json",
                "--skip-git-repo-check",
                "-"
            ]
        );
    }
}
