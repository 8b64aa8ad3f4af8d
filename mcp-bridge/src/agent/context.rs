//! What a runtime's launcher knows of its session ([`Context`], read from
//! the environment Troupe gives every agent), and the text it adds to the
//! CLI's own system prompt: the definition's prompt, then the team context
//! ([`Context::system_prompt`]).

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use troupe_proto::agent::{
    Runtime, env as agent_env,
    runtime::{MODEL, PROMPT},
};

/// Troupe's tools, as the MCP server `troupe` offers them.
pub const TOOLS: [&str; 14] = [
    "create_session",
    "send_message",
    "list_workspace_sessions",
    "get_session",
    "wait_for_session",
    "terminate_session",
    "report_progress",
    "reply_to_parent",
    "finish",
    "broadcast",
    "create_group",
    "add_to_group",
    "post_to_group",
    "list_groups",
];

/// The session as its launcher sees it.
#[derive(Clone, Debug)]
pub struct Context {
    pub runtime: Runtime,
    pub session_id: String,
    pub workspace_id: String,
    pub trust: String,
    /// Whether the session has a parent it may answer.
    pub has_parent: bool,
    /// The definition's Markdown body.
    pub prompt: String,
    /// The definition's `model`.
    pub model: String,
    /// Where the CLI's configuration and state go: a folder of the agent's
    /// private `HOME`.
    pub state: PathBuf,
    /// The private `HOME` itself, where the CLIs look for their settings.
    pub home: PathBuf,
    /// The gateway: `http://127.0.0.1:PORT` (Anthropic's and Gemini's base).
    pub base_url: String,
    /// The gateway's OpenAI base: `http://127.0.0.1:PORT/v1`.
    pub openai_base_url: String,
    /// This program, which serves Troupe's tools as the CLI's MCP server.
    pub mcp_command: PathBuf,
    /// The variables the MCP server needs, to be passed on by name by a
    /// CLI that does not give its servers its whole environment.
    pub forwarded: Vec<String>,
}

impl Context {
    /// Reads the session from the environment of `runtime`'s launcher.
    pub fn from_env(runtime: Runtime) -> anyhow::Result<Context> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let need = |name: &str, what: &str| {
            var(name).with_context(|| {
                format!("{name} is not set: it holds {what}, which Troupe gives every agent")
            })
        };
        let home = PathBuf::from(need("HOME", "the agent's private home")?);
        let base_url = need(agent_env::ANTHROPIC_BASE_URL, "the model gateway's address")?;
        let mut forwarded: Vec<String> = std::env::vars_os()
            .filter_map(|(name, _)| name.into_string().ok())
            .filter(|name| {
                (name.starts_with("TROUPE_") && name != PROMPT && name != MODEL)
                    || name == agent_env::TRACEPARENT
            })
            .collect();
        forwarded.sort();
        Ok(Context {
            runtime,
            session_id: need(agent_env::SESSION_ID, "the session's id")?,
            workspace_id: need(agent_env::WORKSPACE_ID, "the session's workspace")?,
            trust: var(agent_env::TRUST_LEVEL).unwrap_or_else(|| "sandboxed".into()),
            has_parent: var(agent_env::PARENT_SESSION_ID).is_some()
                || var(agent_env::DEPTH).is_some_and(|d| d != "0"),
            prompt: var(PROMPT).unwrap_or_default(),
            model: need(MODEL, "the definition's model")?,
            state: home.join(".troupe").join(runtime.as_str()),
            home,
            openai_base_url: var(agent_env::OPENAI_BASE_URL)
                .unwrap_or_else(|| format!("{base_url}/v1")),
            base_url,
            mcp_command: std::env::current_exe()
                .context("cannot find this program, troupe-mcp, to serve Troupe's tools")?,
            forwarded,
        })
    }

    /// A file of the launcher's state folder.
    pub fn file(&self, name: &str) -> PathBuf {
        self.state.join(name)
    }

    /// What the launcher adds to the CLI's own system prompt: the
    /// definition's prompt, then how to work in the team.
    pub fn system_prompt(&self) -> String {
        let team = team_context(self);
        if self.prompt.trim().is_empty() {
            team
        } else {
            format!("{}\n\n{team}", self.prompt.trim())
        }
    }
}

/// How to work as a member of the team: who the agent is, how messages
/// reach it, its tools and how to finish; for a CLI without Troupe's tools,
/// that its last answer is its result.
fn team_context(ctx: &Context) -> String {
    let who = format!(
        "You are a member of a Troupe team: session {} in workspace {}, trust level {}. \
         Files in /workspace are shared with the team.",
        ctx.session_id, ctx.workspace_id, ctx.trust
    );
    if !ctx.runtime.has_tools() {
        return format!(
            "{who} Your first message is your task. You have no tools to reach the rest of \
             the team: your last answer is your result, handed as it is to the session that \
             gave you the task, so end with a complete answer."
        );
    }
    let parent = if ctx.has_parent {
        " You have a parent session, which gave you your task: tell it what it needs to hear \
         while you work with reply_to_parent (no session id needed), and when your task is \
         done, or cannot be done, call finish once, last, with your complete answer as result \
         and outcome success or failure: your parent receives exactly that result, and your \
         session then ends."
    } else {
        " You have no parent session: the operator reads your output."
    };
    format!(
        "{who} Each user message begins with a line saying who sent it; answer a session with \
         the send_message tool and its session_id. Troupe's tools come from the MCP server \
         \"troupe\": {tools}. Hand work to other agents of the workspace with create_session, \
         find them with list_workspace_sessions, follow them with get_session and \
         wait_for_session. A session you create may keep running, waiting for messages, until \
         you end it with terminate_session: end each one once its work is done. Tell how far \
         your own task has come with report_progress. Tell many sessions at once with \
         broadcast, or keep a named group (create_group, add_to_group, post_to_group, \
         list_groups).{parent}",
        tools = TOOLS.join(", ")
    )
}

/// Writes `text` to `path`, readable by the agent's uid alone (the folder
/// is its private home's), making its folder first.
pub fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    troupe_proto::paths::write_private(path, text)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn context(runtime: Runtime, dir: &Path) -> Context {
        Context {
            runtime,
            session_id: "sess_a".into(),
            workspace_id: "demo".into(),
            trust: "direct".into(),
            has_parent: true,
            prompt: "You write tests.".into(),
            model: "m-1".into(),
            state: dir.join(".troupe").join(runtime.as_str()),
            home: dir.to_owned(),
            base_url: "http://127.0.0.1:4100".into(),
            openai_base_url: "http://127.0.0.1:4100/v1".into(),
            mcp_command: PathBuf::from("/opt/troupe/bin/troupe-mcp"),
            forwarded: vec![
                "TROUPE_SESSION_ENDPOINT".into(),
                "TROUPE_SESSION_TOKEN".into(),
            ],
        }
    }

    #[test]
    fn the_system_prompt_is_the_definitions_then_the_team_context() {
        let dir = Path::new("/home/x");
        let prompt = context(Runtime::Codex, dir).system_prompt();
        assert!(prompt.starts_with("You write tests.\n\nYou are a member of a Troupe team: session sess_a in workspace demo, trust level direct."), "{prompt}");
        for said in [
            "reply_to_parent",
            "call finish once, last",
            "outcome",
            "create_group",
            "MCP server \"troupe\"",
        ] {
            assert!(prompt.contains(said), "{said}: {prompt}");
        }
        let mut root = context(Runtime::Codex, dir);
        root.has_parent = false;
        root.prompt.clear();
        let prompt = root.system_prompt();
        assert!(prompt.starts_with("You are a member"), "{prompt}");
        assert!(!prompt.contains("call finish"), "{prompt}");
        let leaf = context(Runtime::Aider, dir).system_prompt();
        assert!(leaf.contains("your last answer is your result"), "{leaf}");
        assert!(!leaf.contains("create_session"), "{leaf}");
    }
}
