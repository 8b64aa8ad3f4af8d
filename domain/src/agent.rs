//! Agent definitions: what one holds ([`AgentDefinition`]), how its file
//! is read ([`parse`]: Markdown with YAML front matter in the format Claude
//! Code uses for its agent files, `name`, `description`, `tools`, `model`,
//! plus `command`, the argv Troupe runs, and `env`, variables of its own for
//! that command, [`check_env`]: never one of Troupe's), and what a session
//! keeps of it as its row's `agent_command` ([`Launch`]). Where definitions
//! are looked up is the service's (`troupe_session_svc::agents`).
//!
//! Workspace ids and agent names are slugs ([`validate_slug`]), so they can
//! never name a path outside the workspaces directory.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use troupe_proto::agent::env as agent_env;

use crate::error::{Reason, SessionError};

/// Longest workspace id or agent name.
pub use troupe_proto::names::MAX_SLUG_LEN;

/// Checks that `value` is a slug: 1 to 64 of `[A-Za-z0-9_-]`, starting with a letter or digit.
pub fn validate_slug(field: &'static str, value: &str) -> Result<(), SessionError> {
    let ok = troupe_proto::names::is_slug(value);
    if ok {
        Ok(())
    } else {
        Err(SessionError::invalid(
            field,
            format!(
                "{value:?} is not a valid name: use 1 to {MAX_SLUG_LEN} letters, digits, '-' or '_', starting with a letter or digit"
            ),
        ))
    }
}

/// A parsed agent definition.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentDefinition {
    pub name: String,
    pub description: Option<String>,
    /// The argv to run; never passed through a shell by Troupe.
    pub command: Vec<String>,
    /// The Markdown body (the agent's system prompt).
    pub prompt: String,
    /// Variables given to the command, beside Troupe's own ([`check_env`]).
    pub env: BTreeMap<String, String>,
}

/// Most variables one definition may set.
pub const MAX_ENV_VARS: usize = 64;
/// Longest value of a variable, in bytes.
pub const MAX_ENV_VALUE: usize = 16 << 10;

/// Checks the `env` of a definition: valid names, none of Troupe's own
/// ([`agent_env::is_reserved`]: `TROUPE_*`, `PARACHUTE_*`, the model
/// variables, `TRACEPARENT`), no NUL, within [`MAX_ENV_VARS`] and
/// [`MAX_ENV_VALUE`]. The error says which variable and why.
pub fn check_env(env: &BTreeMap<String, String>) -> Result<(), String> {
    if env.len() > MAX_ENV_VARS {
        return Err(format!(
            "`env` sets {} variables, more than {MAX_ENV_VARS}",
            env.len()
        ));
    }
    for (name, value) in env {
        if !agent_env::is_valid_name(name) {
            return Err(format!(
                "`env` variable {name:?} is not a valid name: use letters, digits and '_', not starting with a digit"
            ));
        }
        if agent_env::is_reserved(name) {
            return Err(format!(
                "`env` may not set {name}: Troupe sets it (TROUPE_*, PARACHUTE_*, \
                 ANTHROPIC_BASE_URL, OPENAI_BASE_URL, ANTHROPIC_API_KEY, OPENAI_API_KEY and TRACEPARENT are Troupe's)"
            ));
        }
        if value.contains('\0') {
            return Err(format!("`env` variable {name} contains a NUL byte"));
        }
        if value.len() > MAX_ENV_VALUE {
            return Err(format!(
                "`env` variable {name} is longer than {MAX_ENV_VALUE} bytes"
            ));
        }
    }
    Ok(())
}

#[derive(Deserialize)]
struct FrontMatter {
    name: Option<String>,
    description: Option<String>,
    command: Option<Command>,
    env: Option<BTreeMap<String, EnvValue>>,
}

/// A value of `env` as YAML gives it: `KEY: 100` is `"100"`.
#[derive(Deserialize)]
#[serde(untagged)]
enum EnvValue {
    Text(String),
    Integer(i64),
    Float(f64),
    Bool(bool),
}

impl EnvValue {
    fn into_text(self) -> String {
        match self {
            EnvValue::Text(text) => text,
            EnvValue::Integer(n) => n.to_string(),
            EnvValue::Float(x) => x.to_string(),
            EnvValue::Bool(b) => b.to_string(),
        }
    }
}

/// What a session runs, as its row keeps it (the `agent_command` column,
/// JSON): the argv alone (`["sh", "-c", ...]`) when the definition sets no
/// variables, as every row before `env` existed, else
/// `{"command": [...], "env": {...}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Launch {
    Argv(Vec<String>),
    WithEnv {
        command: Vec<String>,
        env: BTreeMap<String, String>,
    },
}

impl Launch {
    /// What a session of `definition` runs.
    pub fn of(definition: &AgentDefinition) -> Launch {
        if definition.env.is_empty() {
            Launch::Argv(definition.command.clone())
        } else {
            Launch::WithEnv {
                command: definition.command.clone(),
                env: definition.env.clone(),
            }
        }
    }

    /// The argv and the variables.
    pub fn into_parts(self) -> (Vec<String>, BTreeMap<String, String>) {
        match self {
            Launch::Argv(command) => (command, BTreeMap::new()),
            Launch::WithEnv { command, env } => (command, env),
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Command {
    Argv(Vec<String>),
    Line(String),
}

/// Parses an agent file named `agent`.
pub fn parse(agent: &str, text: &str) -> Result<AgentDefinition, SessionError> {
    let invalid = |why: String| {
        SessionError::refused(
            Reason::AgentInvalid,
            format!("agent definition {agent:?} is invalid: {why}"),
        )
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let rest = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))
        .ok_or_else(|| {
            invalid("it must start with YAML front matter between '---' lines".into())
        })?;
    let (yaml, body) = split_front_matter(rest)
        .ok_or_else(|| invalid("the front matter has no closing '---' line".into()))?;
    let front: FrontMatter =
        serde_norway::from_str(yaml).map_err(|e| invalid(format!("front matter: {e}")))?;
    let command = match front.command {
        Some(Command::Argv(argv)) => argv,
        Some(Command::Line(line)) => line.split_whitespace().map(str::to_owned).collect(),
        None => return Err(invalid("the front matter has no `command`".into())),
    };
    if command.is_empty() || command[0].is_empty() {
        return Err(invalid("`command` is empty".into()));
    }
    let env: BTreeMap<String, String> = front
        .env
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.into_text()))
        .collect();
    check_env(&env).map_err(invalid)?;
    if let Some(name) = &front.name
        && name != agent
    {
        return Err(invalid(format!(
            "its `name` is {name:?} but the file is named {agent:?}.md"
        )));
    }
    Ok(AgentDefinition {
        name: agent.to_owned(),
        description: front.description,
        command,
        prompt: body.trim().to_owned(),
        env,
    })
}

fn split_front_matter(rest: &str) -> Option<(&str, &str)> {
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            return Some((&rest[..offset], &rest[offset + line.len()..]));
        }
        offset += line.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_reject_paths() {
        for bad in [
            "",
            "../x",
            "a/b",
            ".hidden",
            "x y",
            "-lead",
            &"a".repeat(65),
        ] {
            assert!(validate_slug("agent_name", bad).is_err(), "{bad:?}");
        }
        for good in ["a", "python-specialist", "team_2", "A1"] {
            assert!(validate_slug("agent_name", good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn parses_claude_code_front_matter_with_a_command() {
        let def = parse(
            "reviewer",
            "---\nname: reviewer\ndescription: Reviews code\ntools: Read, Grep\nmodel: sonnet\ncommand: [\"claude\", \"-p\"]\n---\nYou review code.\n",
        )
        .unwrap();
        assert_eq!(def.command, ["claude", "-p"]);
        assert_eq!(def.description.as_deref(), Some("Reviews code"));
        assert_eq!(def.prompt, "You review code.");
    }

    #[test]
    fn a_command_line_splits_on_whitespace() {
        let def = parse("a", "---\ncommand: /tools/demo-agent --verbose\n---\n").unwrap();
        assert_eq!(def.command, ["/tools/demo-agent", "--verbose"]);
    }

    #[test]
    fn the_claude_code_example_parses_and_its_shell_gives_claude_its_arguments() {
        let def = parse("claude", include_str!("../../examples/agents/claude.md")).unwrap();
        assert!(def.description.is_some());
        assert!(!def.prompt.is_empty());
        let [sh, dash_c, script] = def.command.as_slice() else {
            panic!("sh -c SCRIPT, not {:?}", def.command);
        };
        assert_eq!((sh.as_str(), dash_c.as_str()), ("sh", "-c"));
        let rest = script
            .strip_prefix("troupe-mcp claude-input | claude ")
            .unwrap_or_else(|| panic!("a pipe from claude-input to claude: {script}"));
        // What the shell hands to claude, with the environment an agent has.
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf '%s\\0' {rest}"))
            .env("TROUPE_SESSION_ID", "sess_x")
            .env("TROUPE_WORKSPACE_ID", "demo")
            .env("TROUPE_TRUST_LEVEL", "direct")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        let argv: Vec<&str> = text.trim_end_matches('\0').split('\0').collect();
        let value = |flag: &str| {
            let at = argv.iter().position(|a| *a == flag);
            at.and_then(|i| argv.get(i + 1).copied())
                .unwrap_or_else(|| panic!("{flag} and a value in {argv:?}"))
        };
        assert_eq!(argv[0], "-p");
        assert_eq!(value("--input-format"), "stream-json");
        assert_eq!(value("--output-format"), "stream-json");
        assert!(argv.contains(&"--verbose"), "{argv:?}");
        let config: serde_json::Value = serde_json::from_str(value("--mcp-config")).unwrap();
        assert_eq!(
            config,
            serde_json::json!({"mcpServers": {"troupe": {"command": "troupe-mcp", "args": []}}})
        );
        let allowed: Vec<&str> = value("--allowedTools").split(',').collect();
        let tools = [
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
        assert_eq!(allowed, tools.map(|t| format!("mcp__troupe__{t}")));
        let prompt = value("--append-system-prompt");
        assert!(
            prompt.contains("session sess_x in workspace demo, trust level direct"),
            "{prompt}"
        );
        // It says how a child answers its parent.
        for said in ["reply_to_parent", "call finish once, last", "outcome"] {
            assert!(prompt.contains(said), "{said}: {prompt}");
        }
    }

    #[test]
    fn env_gives_the_command_variables_and_yaml_scalars_as_text() {
        let def = parse(
            "a",
            "---\ncommand: x\nenv:\n  CLAUDE_CODE_MAX_OUTPUT_TOKENS: 4096\n  DEBUG: true\n  HOME: /workspace/home\n  NOTE: \"a b\"\n---\n",
        )
        .unwrap();
        assert_eq!(
            def.env,
            BTreeMap::from(
                [
                    ("CLAUDE_CODE_MAX_OUTPUT_TOKENS", "4096"),
                    ("DEBUG", "true"),
                    ("HOME", "/workspace/home"),
                    ("NOTE", "a b"),
                ]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
            )
        );
        assert!(parse("a", "---\ncommand: x\n---\n").unwrap().env.is_empty());
    }

    /// Every name Troupe sets, and every malformed name, is refused by
    /// name; the limits hold.
    #[test]
    fn env_may_not_set_troupes_variables_nor_bad_names() {
        let refused = |yaml: &str, why: &str| {
            let text = format!("---\ncommand: x\nenv:\n{yaml}---\n");
            let err = parse("a", &text).unwrap_err();
            assert_eq!(err.reason(), Reason::AgentInvalid, "{yaml}");
            assert!(err.to_string().contains(why), "{err} should say {why}");
        };
        for name in [
            "TROUPE_SESSION_TOKEN",
            "TROUPE_SESSION_ENDPOINT",
            "TROUPE_ANYTHING",
            "PARACHUTE_SESSION_ID",
            "ANTHROPIC_BASE_URL",
            "OPENAI_BASE_URL",
            "ANTHROPIC_API_KEY",
            "OPENAI_API_KEY",
            "TRACEPARENT",
        ] {
            refused(&format!("  {name}: x\n"), &format!("may not set {name}"));
        }
        for name in ["1X", "A-B", "\"A B\"", "\"\""] {
            refused(&format!("  {name}: x\n"), "not a valid name");
        }
        refused("  A: \"a\\0b\"\n", "NUL");
        let long = "v".repeat(MAX_ENV_VALUE + 1);
        refused(&format!("  A: {long}\n"), "longer than");
        let many: String = (0..=MAX_ENV_VARS).map(|i| format!("  V{i}: x\n")).collect();
        refused(&many, "more than");
        let most: String = (0..MAX_ENV_VARS).map(|i| format!("  V{i}: x\n")).collect();
        assert!(parse("a", &format!("---\ncommand: x\nenv:\n{most}---\n")).is_ok());
    }

    #[test]
    fn a_launch_without_env_is_the_argv_a_row_always_held() {
        let mut def = parse("a", "---\ncommand: [x, y]\n---\n").unwrap();
        let plain = serde_json::to_string(&Launch::of(&def)).unwrap();
        assert_eq!(plain, r#"["x","y"]"#);
        def.env.insert("K".into(), "v".into());
        let full = serde_json::to_string(&Launch::of(&def)).unwrap();
        assert_eq!(full, r#"{"command":["x","y"],"env":{"K":"v"}}"#);
        for text in [plain, full] {
            let launch: Launch = serde_json::from_str(&text).unwrap();
            assert_eq!(launch.into_parts().0, ["x", "y"]);
        }
    }

    #[test]
    fn invalid_definitions_say_why() {
        for (text, why) in [
            ("no front matter", "front matter"),
            ("---\ncommand: x\n", "closing"),
            ("---\nname: a\n---\n", "no `command`"),
            ("---\ncommand: []\n---\n", "empty"),
            ("---\nname: other\ncommand: x\n---\n", "named"),
        ] {
            let err = parse("a", text).unwrap_err();
            assert_eq!(err.reason(), Reason::AgentInvalid);
            assert!(err.to_string().contains(why), "{err} should mention {why}");
        }
    }
}
