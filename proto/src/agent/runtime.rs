//! The agent CLIs Troupe runs by name ([`Runtime`]): an agent definition's
//! `runtime` names one instead of a `command`, and `troupe-mcp agent
//! RUNTIME` composes what that CLI needs inside the container (its command
//! line, Troupe's MCP server in its own configuration, its system prompt,
//! its model, messages as turns). The session service passes the
//! definition's prompt and model to it as [`PROMPT`] and [`MODEL`].

use std::fmt;

use serde::{Deserialize, Serialize};

/// The definition's Markdown body, the agent's own system prompt.
pub const PROMPT: &str = "TROUPE_AGENT_PROMPT";
/// The definition's `model`: a model of the gateway.
pub const MODEL: &str = "TROUPE_AGENT_MODEL";
/// Longest prompt of a runtime's definition, in bytes: it travels in the
/// agent's environment, where one variable holds at most 128 KiB.
pub const MAX_PROMPT_BYTES: usize = 64 << 10;
/// Longest model name, in bytes.
pub const MAX_MODEL_BYTES: usize = 256;

/// An agent CLI Troupe knows how to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Runtime {
    /// Claude Code (`claude`): Anthropic Messages; messages reach it mid-run.
    #[serde(rename = "claude-code")]
    ClaudeCode,
    /// Codex (`codex exec`): OpenAI Responses; a message is a new turn.
    #[serde(rename = "codex")]
    Codex,
    /// Gemini CLI (`gemini`): the Gemini API; a message is a new turn.
    #[serde(rename = "gemini-cli")]
    GeminiCli,
    /// OpenCode (`opencode run`): Chat Completions; a message is a new turn.
    #[serde(rename = "opencode")]
    OpenCode,
    /// Aider (`aider`): Chat Completions, no MCP client: a leaf worker whose
    /// last answer is its result.
    #[serde(rename = "aider")]
    Aider,
}

impl Runtime {
    pub const ALL: [Runtime; 5] = [
        Runtime::ClaudeCode,
        Runtime::Codex,
        Runtime::GeminiCli,
        Runtime::OpenCode,
        Runtime::Aider,
    ];

    /// Its name in an agent file.
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::ClaudeCode => "claude-code",
            Runtime::Codex => "codex",
            Runtime::GeminiCli => "gemini-cli",
            Runtime::OpenCode => "opencode",
            Runtime::Aider => "aider",
        }
    }

    /// The runtime an agent file names, if Troupe knows it.
    pub fn parse(name: &str) -> Option<Runtime> {
        Runtime::ALL.into_iter().find(|r| r.as_str() == name)
    }

    /// Whether the CLI has an MCP client, and so Troupe's tools. One without
    /// is a leaf worker: its last answer is its result.
    pub fn has_tools(self) -> bool {
        self != Runtime::Aider
    }

    /// The names of every runtime, for a message: `claude-code, codex, ...`.
    pub fn names() -> String {
        Runtime::ALL.map(Runtime::as_str).join(", ")
    }
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_as_text_and_json() {
        for runtime in Runtime::ALL {
            assert_eq!(Runtime::parse(runtime.as_str()), Some(runtime));
            let json = serde_json::to_string(&runtime).unwrap();
            assert_eq!(json, format!("\"{runtime}\""));
            assert_eq!(serde_json::from_str::<Runtime>(&json).unwrap(), runtime);
        }
        for unknown in ["", "claude", "Codex", "gemini", "open-code"] {
            assert_eq!(Runtime::parse(unknown), None, "{unknown}");
        }
        assert_eq!(
            Runtime::names(),
            "claude-code, codex, gemini-cli, opencode, aider"
        );
    }
}
