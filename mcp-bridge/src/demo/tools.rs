//! The MCP client: starts `troupe-mcp` (or `TROUPE_MCP_COMMAND`) as a child
//! process speaking MCP on its stdin/stdout, and calls its tools by name. The
//! child inherits this process's environment, so it acts as this session.

use rmcp::{
    RoleClient, ServiceError, ServiceExt,
    model::{CallToolRequestParams, CallToolResult, ErrorCode},
    service::RunningService,
    transport::TokioChildProcess,
};
use serde_json::Value;
use tokio::process::Command;

/// Environment variable naming the bridge's executable.
pub const COMMAND_ENV: &str = "TROUPE_MCP_COMMAND";
/// The bridge found on `PATH` when [`COMMAND_ENV`] is not set.
pub const DEFAULT_COMMAND: &str = "troupe-mcp";

/// A tool's answer.
#[derive(Debug)]
pub enum Answer {
    /// The tool ran: its structured result.
    Done(Value),
    /// The tool (or the session service behind it) refused.
    Refused { reason: String, text: String },
}

/// A running bridge.
pub struct Tools {
    service: RunningService<RoleClient, ()>,
}

impl Tools {
    /// Starts the bridge and completes the MCP handshake.
    pub async fn start() -> Result<Tools, String> {
        let program = std::env::var(COMMAND_ENV)
            .ok()
            .filter(|p| !p.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_COMMAND.to_owned());
        let mut command = Command::new(&program);
        command.kill_on_drop(true);
        let transport = TokioChildProcess::new(command)
            .map_err(|e| format!("cannot start the MCP bridge {program:?}: {e}"))?;
        let service = ().serve(transport).await.map_err(|e| {
            format!("the MCP bridge {program:?} did not complete the handshake: {e}")
        })?;
        Ok(Tools { service })
    }

    /// Calls `name` with `arguments` (an object). A protocol error (bad
    /// arguments) is a refusal like any other; only a bridge that is gone is
    /// an `Err`.
    pub async fn call(&self, name: &str, arguments: Value) -> Result<Answer, String> {
        let mut params = CallToolRequestParams::new(name.to_owned());
        if let Value::Object(arguments) = arguments {
            params = params.with_arguments(arguments);
        }
        match self.service.call_tool(params).await {
            Ok(result) => Ok(answer(result)),
            Err(ServiceError::McpError(error)) => Ok(Answer::Refused {
                reason: if error.code == ErrorCode::INVALID_PARAMS {
                    "INVALID_ARGUMENT".to_owned()
                } else {
                    "MCP_ERROR".to_owned()
                },
                text: format!("MCP error {}: {}", error.code.0, error.message),
            }),
            Err(e) => Err(format!("the MCP bridge failed during {name}: {e}")),
        }
    }

    /// Closes the bridge's stdin, so that it exits.
    pub async fn close(self) {
        let _ = self.service.cancel().await;
    }
}

fn answer(result: CallToolResult) -> Answer {
    let text: Vec<&str> = result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|t| t.text.as_str()))
        .collect();
    let text = text.join("\n");
    if result.is_error == Some(true) {
        let error = result
            .structured_content
            .as_ref()
            .map(|value| &value["error"]);
        let reason = error
            .and_then(|e| e["reason"].as_str().or_else(|| e["code"].as_str()))
            .unwrap_or("REFUSED")
            .to_owned();
        return Answer::Refused { reason, text };
    }
    let value = match result.structured_content {
        Some(value) => value,
        None => serde_json::from_str(&text).unwrap_or(Value::String(text)),
    };
    Answer::Done(value)
}
