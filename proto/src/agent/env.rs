//! The environment of an agent: the names of its variables, and
//! [`AgentEnv`], the session's context as the session service gives it.
//!
//! The runner adds only what is its own (`HOME`, `TMPDIR`, `PATH`,
//! `TRACEPARENT`, the endpoint inside the container), and for a caller that
//! starts an exec by hand, the session id and workspace defaults and the
//! [`ALIASES`] ([`add_aliases`]). [`is_reserved`] names the variables an
//! agent definition's `env` may not set.

use std::collections::HashMap;

use crate::session::TrustLevel;

/// The session's id.
pub const SESSION_ID: &str = "TROUPE_SESSION_ID";
/// The session's workspace.
pub const WORKSPACE_ID: &str = "TROUPE_WORKSPACE_ID";
/// `direct` or `sandboxed`.
pub const TRUST_LEVEL: &str = "TROUPE_TRUST_LEVEL";
/// The id of the session's spawn tree.
pub const TREE_ID: &str = "TROUPE_TREE_ID";
/// The session's depth in its tree (0 for a root).
pub const DEPTH: &str = "TROUPE_DEPTH";
/// The name of the session's agent.
pub const AGENT_NAME: &str = "TROUPE_AGENT_NAME";
/// The parent's id, left out when the agent may not see it.
pub const PARENT_SESSION_ID: &str = "TROUPE_PARENT_SESSION_ID";
/// The session's own token.
pub const SESSION_TOKEN: &str = "TROUPE_SESSION_TOKEN";
/// The session service's endpoint.
pub const SESSION_ENDPOINT: &str = "TROUPE_SESSION_ENDPOINT";

/// The Anthropic API's base URL the agent's model calls go to: the
/// supervisor's port on the container's loopback (`http://127.0.0.1:PORT`),
/// forwarded to the session service's socket.
pub const ANTHROPIC_BASE_URL: &str = "ANTHROPIC_BASE_URL";
/// The OpenAI API's base URL, the same port: `http://127.0.0.1:PORT/v1`.
pub const OPENAI_BASE_URL: &str = "OPENAI_BASE_URL";
/// The key of the agent's Anthropic client: the session's own token.
pub const ANTHROPIC_API_KEY: &str = "ANTHROPIC_API_KEY";
/// The key of the agent's OpenAI client: the session's own token.
pub const OPENAI_API_KEY: &str = "OPENAI_API_KEY";
/// The four variables through which an agent reaches its model.
pub const MODEL_VARS: [&str; 4] = [
    ANTHROPIC_BASE_URL,
    OPENAI_BASE_URL,
    ANTHROPIC_API_KEY,
    OPENAI_API_KEY,
];
/// The W3C trace context the runner gives an agent, under its session's life.
pub const TRACEPARENT: &str = "TRACEPARENT";

/// The `PARACHUTE_*` names older agents read, each the same value as its
/// `TROUPE_*` name.
pub const ALIASES: [(&str, &str); 3] = [
    (SESSION_ID, "PARACHUTE_SESSION_ID"),
    (WORKSPACE_ID, "PARACHUTE_WORKSPACE_ID"),
    (TRUST_LEVEL, "PARACHUTE_TRUST_LEVEL"),
];

/// Gives each [`ALIASES`] name its `TROUPE_*` name's value, where the first
/// is not set and the second is.
pub fn add_aliases(env: &mut HashMap<String, String>) {
    for (troupe, parachute) in ALIASES {
        if let Some(value) = env.get(troupe).cloned() {
            env.entry(parachute.to_owned()).or_insert(value);
        }
    }
}

/// Whether `name` is one of Troupe's own variables, which an agent
/// definition may not set: every `TROUPE_*` and `PARACHUTE_*` name, the
/// [`MODEL_VARS`] and [`TRACEPARENT`].
pub fn is_reserved(name: &str) -> bool {
    name.starts_with("TROUPE_")
        || name.starts_with("PARACHUTE_")
        || MODEL_VARS.contains(&name)
        || name == TRACEPARENT
}

/// Whether `name` can name an environment variable: a letter or `_`, then
/// letters, digits and `_`.
pub fn is_valid_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A session's context, as its agent's environment.
#[derive(Clone, Debug)]
pub struct AgentEnv<'a> {
    pub session_id: &'a str,
    pub workspace_id: &'a str,
    pub trust: TrustLevel,
    pub tree_id: &'a str,
    pub depth: u32,
    pub agent_name: &'a str,
    /// `None` when there is none, or the agent may not be told it.
    pub parent_session_id: Option<&'a str>,
    pub token: &'a str,
}

impl AgentEnv<'_> {
    /// The variables, with their [`ALIASES`].
    pub fn vars(&self) -> HashMap<String, String> {
        let mut env: HashMap<String, String> = [
            (SESSION_ID, self.session_id.to_owned()),
            (WORKSPACE_ID, self.workspace_id.to_owned()),
            (TRUST_LEVEL, crate::trust::as_str(self.trust).to_owned()),
            (TREE_ID, self.tree_id.to_owned()),
            (DEPTH, self.depth.to_string()),
            (AGENT_NAME, self.agent_name.to_owned()),
            (SESSION_TOKEN, self.token.to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        if let Some(parent) = self.parent_session_id {
            env.insert(PARENT_SESSION_ID.to_owned(), parent.to_owned());
        }
        add_aliases(&mut env);
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(parent: Option<&str>) -> AgentEnv<'_> {
        AgentEnv {
            session_id: "sess_a",
            workspace_id: "ws",
            trust: TrustLevel::Sandboxed,
            tree_id: "tree_1",
            depth: 2,
            agent_name: "coder",
            parent_session_id: parent,
            token: "tok",
        }
    }

    fn sorted(env: HashMap<String, String>) -> Vec<String> {
        let mut vars: Vec<String> = env.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        vars.sort();
        vars
    }

    #[test]
    fn the_context_with_its_aliases() {
        assert_eq!(
            sorted(context(Some("sess_p")).vars()),
            [
                "PARACHUTE_SESSION_ID=sess_a",
                "PARACHUTE_TRUST_LEVEL=sandboxed",
                "PARACHUTE_WORKSPACE_ID=ws",
                "TROUPE_AGENT_NAME=coder",
                "TROUPE_DEPTH=2",
                "TROUPE_PARENT_SESSION_ID=sess_p",
                "TROUPE_SESSION_ID=sess_a",
                "TROUPE_SESSION_TOKEN=tok",
                "TROUPE_TREE_ID=tree_1",
                "TROUPE_TRUST_LEVEL=sandboxed",
                "TROUPE_WORKSPACE_ID=ws",
            ]
        );
        assert!(!context(None).vars().contains_key(PARENT_SESSION_ID));
    }

    #[test]
    fn troupe_names_are_reserved_and_others_are_not() {
        for name in [
            SESSION_TOKEN,
            "TROUPE_ANYTHING",
            "PARACHUTE_SESSION_ID",
            ANTHROPIC_BASE_URL,
            OPENAI_BASE_URL,
            ANTHROPIC_API_KEY,
            OPENAI_API_KEY,
            TRACEPARENT,
        ] {
            assert!(is_reserved(name), "{name}");
        }
        for name in ["HOME", "PATH", "ANTHROPIC_MODEL", "troupe_x", "MY_TROUPE_X"] {
            assert!(!is_reserved(name), "{name}");
        }
    }

    #[test]
    fn variable_names_are_checked() {
        for name in ["A", "_x", "CLAUDE_CODE_MAX_OUTPUT_TOKENS", "a1"] {
            assert!(is_valid_name(name), "{name}");
        }
        for name in ["", "1A", "A-B", "A B", "A=B", "É"] {
            assert!(!is_valid_name(name), "{name}");
        }
    }

    #[test]
    fn aliases_follow_what_is_set_and_keep_what_a_caller_gave() {
        let mut env = HashMap::from([
            (SESSION_ID.to_owned(), "x".to_owned()),
            ("PARACHUTE_SESSION_ID".to_owned(), "given".to_owned()),
            (TRUST_LEVEL.to_owned(), "direct".to_owned()),
        ]);
        add_aliases(&mut env);
        assert_eq!(
            sorted(env),
            [
                "PARACHUTE_SESSION_ID=given",
                "PARACHUTE_TRUST_LEVEL=direct",
                "TROUPE_SESSION_ID=x",
                "TROUPE_TRUST_LEVEL=direct",
            ]
        );
    }
}
