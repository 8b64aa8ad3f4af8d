//! Agent definitions as every backend stores them: one row per scope and
//! name, what it runs as JSON (a command's argv as an array, a runtime as
//! `{"runtime": .., "model": ..}`: [`Run`]) and its `env` as a JSON object,
//! parsed once as they are read.

use std::collections::BTreeMap;

use crate::{
    agent::{AgentDefinition, Run},
    error::SessionError,
    model::{AgentScope, NewAgent, Principal, StoredAgent},
    parse_stored,
};

/// Expands to the columns of an `agents` row, in [`AgentRow`]'s field
/// order, for `concat!`.
macro_rules! agent_columns {
    () => {
        "workspace_id, name, description, command, prompt, definition, updated_at_ms, updated_by, env"
    };
}
pub(super) use agent_columns;

/// An `agents` row as read.
#[derive(sqlx::FromRow)]
pub(super) struct AgentRow {
    workspace_id: String,
    name: String,
    description: Option<String>,
    command: String,
    prompt: String,
    definition: String,
    updated_at_ms: i64,
    updated_by: String,
    env: String,
}

impl AgentRow {
    /// What definitions are listed by: workspace (every workspace's first),
    /// then name, byte by byte.
    pub(super) fn order_key(&self) -> (&str, &str) {
        (&self.workspace_id, &self.name)
    }

    pub(super) fn into_stored(self) -> Result<StoredAgent, SessionError> {
        let run: Run = parse_stored("agent command", &self.command, |text| {
            serde_json::from_str(text).ok()
        })?;
        let env: BTreeMap<String, String> = parse_stored("agent env", &self.env, |text| {
            serde_json::from_str(text).ok()
        })?;
        Ok(StoredAgent {
            scope: AgentScope::of(&self.workspace_id),
            definition: AgentDefinition {
                name: self.name,
                description: self.description,
                run,
                prompt: self.prompt,
                env,
            },
            source: self.definition,
            updated_at_ms: self.updated_at_ms,
            updated_by: parse_stored("agent's author", &self.updated_by, Principal::parse)?,
        })
    }
}

/// The command of a definition, as stored.
pub(super) fn command_json(agent: &NewAgent) -> Result<String, SessionError> {
    serde_json::to_string(&agent.definition.run)
        .map_err(|e| SessionError::Internal(format!("agent command: {e}")))
}

/// The `env` of a definition, as stored.
pub(super) fn env_json(agent: &NewAgent) -> Result<String, SessionError> {
    serde_json::to_string(&agent.definition.env)
        .map_err(|e| SessionError::Internal(format!("agent env: {e}")))
}
