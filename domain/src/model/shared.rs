//! What every service on one database shares instead of reading it from its
//! own disk: the operator token ([`OperatorToken`], a secret: no `Debug`
//! of it, compared in constant time), and agent definitions kept in the
//! database ([`AgentScope`]: one workspace, or all).

use std::fmt;

use subtle::ConstantTimeEq;

use super::Principal;
use crate::agent::AgentDefinition;

/// The operator token: a secret. Its `Debug` names no character of it, and
/// it is compared in constant time.
#[derive(Clone)]
pub struct OperatorToken(String);

impl OperatorToken {
    /// Shortest accepted token, in bytes.
    pub const MIN_LEN: usize = 16;

    /// Wraps `token` (trimmed); `None` if shorter than [`Self::MIN_LEN`].
    pub fn new(token: &str) -> Option<OperatorToken> {
        let token = token.trim();
        (token.len() >= Self::MIN_LEN).then(|| OperatorToken(token.to_owned()))
    }

    /// The secret itself, for comparing a bearer token, calling the runner,
    /// storing it and writing it to the token file.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl PartialEq for OperatorToken {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_bytes().ct_eq(other.0.as_bytes()).into()
    }
}

impl Eq for OperatorToken {}

impl fmt::Debug for OperatorToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OperatorToken(..)")
    }
}

/// Which workspaces an agent definition kept in the database is for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AgentScope {
    /// Every workspace (stored as the empty workspace id).
    All,
    /// One workspace, by id (a slug).
    Workspace(String),
}

impl AgentScope {
    /// The scope a request names: its workspace id, or every workspace when empty.
    pub fn of(workspace_id: &str) -> AgentScope {
        if workspace_id.is_empty() {
            AgentScope::All
        } else {
            AgentScope::Workspace(workspace_id.to_owned())
        }
    }

    /// The workspace id as stored and sent: empty for every workspace.
    pub fn workspace_id(&self) -> &str {
        match self {
            AgentScope::All => "",
            AgentScope::Workspace(id) => id,
        }
    }
}

impl fmt::Display for AgentScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AgentScope::All => f.write_str("*"),
            AgentScope::Workspace(id) => f.write_str(id),
        }
    }
}

/// An agent definition to store: where it applies, what parsing its
/// Markdown gave, and the Markdown itself.
#[derive(Clone, Debug, PartialEq)]
pub struct NewAgent {
    pub scope: AgentScope,
    pub definition: AgentDefinition,
    /// The Markdown as applied (front matter and prompt).
    pub source: String,
    pub applied_by: Principal,
}

/// An agent definition kept in the database.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredAgent {
    pub scope: AgentScope,
    pub definition: AgentDefinition,
    /// The Markdown as applied.
    pub source: String,
    pub updated_at_ms: i64,
    pub updated_by: Principal,
}

impl StoredAgent {
    /// How the audit log names it: `<workspace>/<name>`, `*` for every workspace.
    pub fn audit_target(scope: &AgentScope, name: &str) -> String {
        format!("{scope}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operator_token_never_shows_in_debug() {
        let token = OperatorToken::new("secret-secret-secret").unwrap();
        assert_eq!(format!("{token:?}"), "OperatorToken(..)");
        assert!(OperatorToken::new("short").is_none());
        assert_eq!(
            OperatorToken::new("  secret-secret-secret\n").unwrap(),
            token
        );
    }
}
