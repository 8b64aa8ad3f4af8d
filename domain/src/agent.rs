//! Agent definitions: what one holds ([`AgentDefinition`]), how its file
//! is read ([`parse`]: Markdown with YAML front matter in the format Claude
//! Code uses for its agent files, `name`, `description`, `tools`, `model`,
//! plus what Troupe runs ([`Run`]: `command`, an argv, or `runtime`, an agent
//! CLI Troupe composes the command of) and `env`, variables of its own for
//! that command, [`check_env`]: never one of Troupe's), and what a session
//! keeps of it as its row's `agent_command` ([`Launch`]). Where definitions
//! are looked up is the service's (`troupe_session_svc::agents`).
//!
//! Workspace ids and agent names are slugs ([`validate_slug`]), so they can
//! never name a path outside the workspaces directory.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use troupe_proto::agent::{
    env as agent_env,
    runtime::{self, MAX_MODEL_BYTES, MAX_PROMPT_BYTES, Runtime},
};

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
    /// What a session of it runs.
    pub run: Run,
    /// The Markdown body: a runtime's system prompt (for a `command`, for
    /// people alone).
    pub prompt: String,
    /// Variables given to the command, beside Troupe's own ([`check_env`]).
    pub env: BTreeMap<String, String>,
}

/// What a definition runs, as the `agents` row's `command` column keeps it
/// (JSON): an argv (`["sh", "-c", ...]`), as every row before runtimes, or
/// `{"runtime": "codex", "model": "..."}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Run {
    /// `command`: the argv, never passed through a shell by Troupe.
    Command(Vec<String>),
    /// `runtime`: an agent CLI, run by `troupe-mcp agent RUNTIME`.
    Runtime {
        runtime: Runtime,
        /// `model`: a model of the gateway; none leaves the CLI's default.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
    },
}

impl Run {
    /// The command line a session of it runs: a runtime's is
    /// `troupe-mcp agent RUNTIME`.
    pub fn argv(&self) -> Vec<String> {
        match self {
            Run::Command(argv) => argv.clone(),
            Run::Runtime { runtime, .. } => ["troupe-mcp", "agent", runtime.as_str()]
                .map(str::to_owned)
                .to_vec(),
        }
    }

    /// How it reads in the audit log and the CLI: `command ["x"]` or
    /// `runtime codex, model m`.
    pub fn describe(&self) -> String {
        match self {
            Run::Command(argv) => format!("command {argv:?}"),
            Run::Runtime {
                runtime,
                model: Some(model),
            } => format!("runtime {runtime}, model {model}"),
            Run::Runtime {
                runtime,
                model: None,
            } => format!("runtime {runtime}"),
        }
    }
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
    runtime: Option<String>,
    model: Option<String>,
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
/// variables, as every row before `env` existed,
/// `{"command": [...], "env": {...}}` when it does, and for a runtime
/// `{"runtime": "codex", "model": ..., "prompt": ..., "env": {...}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Launch {
    Argv(Vec<String>),
    WithEnv {
        command: Vec<String>,
        env: BTreeMap<String, String>,
    },
    Runtime {
        runtime: Runtime,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
        prompt: String,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        env: BTreeMap<String, String>,
    },
}

/// A [`Launch`] as the runner is asked to start it.
#[derive(Clone, Debug, PartialEq)]
pub struct Started {
    /// The argv.
    pub command: Vec<String>,
    /// The definition's own variables (Troupe's are set over them).
    pub env: BTreeMap<String, String>,
    /// What Troupe gives a runtime's launcher: its prompt and model
    /// ([`runtime::PROMPT`], [`runtime::MODEL`]).
    pub runtime_env: Vec<(&'static str, String)>,
}

impl Launch {
    /// What a session of `definition` runs.
    pub fn of(definition: &AgentDefinition) -> Launch {
        match &definition.run {
            Run::Runtime { runtime, model } => Launch::Runtime {
                runtime: *runtime,
                model: model.clone(),
                prompt: definition.prompt.clone(),
                env: definition.env.clone(),
            },
            Run::Command(command) if definition.env.is_empty() => Launch::Argv(command.clone()),
            Run::Command(command) => Launch::WithEnv {
                command: command.clone(),
                env: definition.env.clone(),
            },
        }
    }

    /// The argv and the variables.
    pub fn into_parts(self) -> Started {
        match self {
            Launch::Argv(command) => Started {
                command,
                env: BTreeMap::new(),
                runtime_env: Vec::new(),
            },
            Launch::WithEnv { command, env } => Started {
                command,
                env,
                runtime_env: Vec::new(),
            },
            Launch::Runtime {
                runtime,
                model,
                prompt,
                env,
            } => {
                let mut runtime_env = vec![(runtime::PROMPT, prompt)];
                runtime_env.extend(model.map(|model| (runtime::MODEL, model)));
                Started {
                    command: Run::Runtime {
                        runtime,
                        model: None,
                    }
                    .argv(),
                    env,
                    runtime_env,
                }
            }
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
    let run = match (front.command, front.runtime) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "it names both a `command` and a `runtime`: give one".into(),
            ));
        }
        (Some(Command::Argv(argv)), None) => Run::Command(argv),
        (Some(Command::Line(line)), None) => {
            Run::Command(line.split_whitespace().map(str::to_owned).collect())
        }
        (None, Some(name)) => {
            let runtime = Runtime::parse(&name).ok_or_else(|| {
                invalid(format!(
                    "`runtime` {name:?} is not one Troupe runs: use one of {}, or a `command`",
                    Runtime::names()
                ))
            })?;
            let model = front.model.ok_or_else(|| {
                invalid(format!(
                    "`runtime` {runtime} needs a `model`: a model of the gateway"
                ))
            })?;
            Run::Runtime {
                runtime,
                model: Some(check_model(model).map_err(invalid)?),
            }
        }
        (None, None) => {
            return Err(invalid(format!(
                "the front matter has no `command` nor `runtime` (one of {})",
                Runtime::names()
            )));
        }
    };
    if let Run::Command(command) = &run
        && (command.is_empty() || command[0].is_empty())
    {
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
    let prompt = body.trim().to_owned();
    if matches!(run, Run::Runtime { .. }) && prompt.len() > MAX_PROMPT_BYTES {
        return Err(invalid(format!(
            "its prompt (the Markdown body) is {} bytes, more than a runtime's {MAX_PROMPT_BYTES}",
            prompt.len()
        )));
    }
    Ok(AgentDefinition {
        name: agent.to_owned(),
        description: front.description,
        run,
        prompt,
        env,
    })
}

/// Checks a runtime's `model`: 1 to [`MAX_MODEL_BYTES`] bytes, no space
/// nor control character (it reaches the CLI's command line and its
/// configuration).
fn check_model(model: String) -> Result<String, String> {
    if model.is_empty() || model.len() > MAX_MODEL_BYTES {
        return Err(format!(
            "`model` must be 1 to {MAX_MODEL_BYTES} bytes, not {}",
            model.len()
        ));
    }
    if model.starts_with('-')
        || model
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '\\')
    {
        return Err(format!(
            "`model` {model:?} may not start with '-' nor hold spaces, quotes, backslashes or control characters"
        ));
    }
    Ok(model)
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
        assert_eq!(def.run, Run::Command(vec!["claude".into(), "-p".into()]));
        assert_eq!(def.description.as_deref(), Some("Reviews code"));
        assert_eq!(def.prompt, "You review code.");
    }

    #[test]
    fn a_command_line_splits_on_whitespace() {
        let def = parse("a", "---\ncommand: /tools/demo-agent --verbose\n---\n").unwrap();
        assert_eq!(def.run.argv(), ["/tools/demo-agent", "--verbose"]);
    }

    #[test]
    fn every_example_names_its_runtime_in_a_few_lines() {
        for (file, text, runtime) in [
            (
                "claude",
                include_str!("../../examples/agents/claude.md"),
                Runtime::ClaudeCode,
            ),
            (
                "codex",
                include_str!("../../examples/agents/codex.md"),
                Runtime::Codex,
            ),
            (
                "gemini",
                include_str!("../../examples/agents/gemini.md"),
                Runtime::GeminiCli,
            ),
            (
                "opencode",
                include_str!("../../examples/agents/opencode.md"),
                Runtime::OpenCode,
            ),
            (
                "aider",
                include_str!("../../examples/agents/aider.md"),
                Runtime::Aider,
            ),
        ] {
            let def = parse(file, text).unwrap_or_else(|e| panic!("{file}: {e}"));
            let Run::Runtime {
                runtime: found,
                model,
            } = &def.run
            else {
                panic!("{file} names no runtime: {:?}", def.run);
            };
            assert_eq!(*found, runtime, "{file}");
            assert!(model.is_some(), "{file} names its model");
            assert!(!def.prompt.is_empty(), "{file} has a prompt");
            let front = text.split("---").nth(1).unwrap();
            assert!(front.lines().count() <= 7, "{file}: a short front matter");
        }
    }

    #[test]
    fn a_runtime_is_run_by_the_launcher_with_its_prompt_and_model() {
        let def = parse(
            "w",
            "---\nruntime: codex\nmodel: gpt-test\nenv:\n  K: v\n---\nYou write tests.\n",
        )
        .unwrap();
        assert_eq!(
            def.run,
            Run::Runtime {
                runtime: Runtime::Codex,
                model: Some("gpt-test".into())
            }
        );
        assert_eq!(def.run.describe(), "runtime codex, model gpt-test");
        let launch = Launch::of(&def);
        let text = serde_json::to_string(&launch).unwrap();
        assert_eq!(
            text,
            r#"{"runtime":"codex","model":"gpt-test","prompt":"You write tests.","env":{"K":"v"}}"#
        );
        let back: Launch = serde_json::from_str(&text).unwrap();
        let started = back.into_parts();
        assert_eq!(started.command, ["troupe-mcp", "agent", "codex"]);
        assert_eq!(started.env["K"], "v");
        assert_eq!(
            started.runtime_env,
            [
                (runtime::PROMPT, "You write tests.".to_owned()),
                (runtime::MODEL, "gpt-test".to_owned())
            ]
        );
        // As the agents row's command column keeps it.
        let stored = serde_json::to_string(&def.run).unwrap();
        assert_eq!(stored, r#"{"runtime":"codex","model":"gpt-test"}"#);
        assert_eq!(serde_json::from_str::<Run>(&stored).unwrap(), def.run);
        let plain: Run = serde_json::from_str(r#"["x"]"#).unwrap();
        assert_eq!(plain, Run::Command(vec!["x".into()]));
    }

    #[test]
    fn a_bad_runtime_model_or_prompt_is_refused_saying_why() {
        let long = "p".repeat(MAX_PROMPT_BYTES + 1);
        for (text, why) in [
            (
                "---\nruntime: claude\n---\n".to_owned(),
                "use one of claude-code, codex",
            ),
            ("---\nruntime: codex\n---\n".to_owned(), "needs a `model`"),
            ("---\nruntime: codex\ncommand: x\n---\n".to_owned(), "both"),
            (
                "---\nruntime: codex\nmodel: \"\"\n---\n".to_owned(),
                "1 to 256",
            ),
            (
                "---\nruntime: codex\nmodel: \"a b\"\n---\n".to_owned(),
                "spaces",
            ),
            (
                "---\nruntime: codex\nmodel: \"--oss\"\n---\n".to_owned(),
                "start with '-'",
            ),
            (
                format!("---\nruntime: codex\nmodel: {}\n---\n", "m".repeat(257)),
                "1 to 256",
            ),
            (
                format!("---\nruntime: aider\nmodel: m\n---\n{long}\n"),
                "more than a runtime's",
            ),
        ] {
            let err = parse("a", &text).unwrap_err();
            assert_eq!(err.reason(), Reason::AgentInvalid, "{text}");
            assert!(err.to_string().contains(why), "{err} should say {why}");
        }
        // A command's body is for people, and not bounded here.
        assert!(parse("a", &format!("---\ncommand: x\n---\n{long}\n")).is_ok());
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
            assert_eq!(launch.into_parts().command, ["x", "y"]);
        }
    }

    #[test]
    fn invalid_definitions_say_why() {
        for (text, why) in [
            ("no front matter", "front matter"),
            ("---\ncommand: x\n", "closing"),
            ("---\nname: a\n---\n", "no `command` nor `runtime`"),
            ("---\ncommand: []\n---\n", "empty"),
            ("---\nname: other\ncommand: x\n---\n", "named"),
        ] {
            let err = parse("a", text).unwrap_err();
            assert_eq!(err.reason(), Reason::AgentInvalid);
            assert!(err.to_string().contains(why), "{err} should mention {why}");
        }
    }
}
