//! The tools' arguments: what the agent sends, as JSON Schema for the
//! tool list and as the types the calls take, and the checks of the
//! arguments that need no service (the wait's length).

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use troupe_proto::session::ExecutionMode;

use crate::failure::ToolFailure;

/// `wait_for_session` waits this long when no timeout is given.
pub const DEFAULT_WAIT_SECS: f64 = 300.0;
/// ... and never longer than this.
pub const MAX_WAIT_SECS: f64 = 3600.0;

/// Arguments of `create_session`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateSessionArgs {
    /// A short human-readable title for the new session, e.g. "API implementation".
    pub title: String,
    /// The agent to run: the name of an agent definition (Agents/<name>.md) of this
    /// workspace, e.g. "python-specialist".
    pub agent_name: String,
    /// The first message the new agent receives: its task, stated completely.
    pub initial_message: String,
    /// Optional: "sandboxed" (or "untrusted") to give the child less trust than this
    /// session. Omit it to inherit this session's level. "direct" (or "trusted") is
    /// allowed only for a direct caller; trust can never be raised.
    #[serde(default)]
    pub trust_level: Option<String>,
    /// Optional: how the call returns. "async" (default): at once, follow up with
    /// get_session or wait_for_session. "sync": when the child has ended, with its
    /// result (status, exit_code, output_tail). "callback": at once, and when the child
    /// ends this session receives a message saying so.
    #[serde(default)]
    pub mode: Option<Mode>,
}

/// How `create_session` returns.
#[derive(Clone, Copy, Debug, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub enum Mode {
    Async,
    Sync,
    Callback,
}

impl From<Mode> for ExecutionMode {
    fn from(mode: Mode) -> Self {
        match mode {
            Mode::Async => ExecutionMode::Async,
            Mode::Sync => ExecutionMode::Sync,
            Mode::Callback => ExecutionMode::Callback,
        }
    }
}

/// Arguments of `send_message`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SendMessageArgs {
    /// The recipient's session id (`sess_...`), as create_session or
    /// list_workspace_sessions returned it.
    pub session_id: String,
    /// The message text.
    pub message: String,
}

/// Arguments of `list_workspace_sessions`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub struct ListArgs {
    /// Optional: also list sessions that have ended (completed, failed, terminated).
    /// Default false: active sessions only.
    #[serde(default)]
    pub include_ended: Option<bool>,
}

/// Arguments of the tools that name one session.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SessionArgs {
    /// The session id (`sess_...`).
    pub session_id: String,
}

/// Arguments of `report_progress`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ProgressArgs {
    /// Percent of the task done, 0 to 100.
    pub progress: u32,
    /// Optional: what is being done now, in a few words (at most 256 bytes).
    #[serde(default)]
    pub description: Option<String>,
}

/// Arguments of `wait_for_session`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct WaitArgs {
    /// The session id (`sess_...`).
    pub session_id: String,
    /// Optional: the longest wait in seconds (default 300, at most 3600).
    #[serde(default)]
    pub timeout_s: Option<f64>,
}

/// The wait's length: the default when absent, capped, never negative.
pub(super) fn wait_timeout(seconds: Option<f64>) -> Result<Duration, ToolFailure> {
    let seconds = seconds.unwrap_or(DEFAULT_WAIT_SECS);
    if !seconds.is_finite() {
        return Err(ToolFailure::invalid(
            "timeout_s",
            "timeout_s must be a number of seconds",
        ));
    }
    Ok(Duration::from_secs_f64(seconds.clamp(0.0, MAX_WAIT_SECS)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn wait_timeout_defaults_and_caps() {
        assert_eq!(wait_timeout(None).unwrap(), Duration::from_secs(300));
        assert_eq!(wait_timeout(Some(1e9)).unwrap(), Duration::from_secs(3600));
        assert_eq!(wait_timeout(Some(-5.0)).unwrap(), Duration::ZERO);
        assert_eq!(wait_timeout(Some(0.5)).unwrap(), Duration::from_millis(500));
        assert!(wait_timeout(Some(f64::NAN)).is_err());
    }

    #[test]
    fn mode_words() {
        let args: CreateSessionArgs = serde_json::from_value(json!({
            "title": "t", "agent_name": "a", "initial_message": "m", "mode": "sync"
        }))
        .unwrap();
        assert_eq!(args.mode, Some(Mode::Sync));
        assert_eq!(ExecutionMode::from(Mode::Callback), ExecutionMode::Callback);
    }
}
