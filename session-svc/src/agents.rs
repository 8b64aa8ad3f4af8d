//! Agent definitions, looked up in this order ([`find`]): the database's
//! for the workspace, the database's for every workspace (applied by
//! operators, shared by every service on the database), then the files
//! `<workspaces-dir>/<workspace>/Agents/<name>.md`, else
//! `<workspaces-dir>/Agents/<name>.md` ([`lookup`]). Markdown with YAML front
//! matter in the format Claude Code uses for its agent files (`name`,
//! `description`, `tools`, `model`), plus `command`, the argv Troupe runs;
//! one parser ([`parse`]) reads files and applied definitions alike.
//!
//! Workspace ids and agent names are slugs ([`validate_slug`]), so they can
//! never name a path outside the workspaces directory.

use std::path::Path;

use serde::Deserialize;

use crate::{
    error::{Reason, SessionError},
    store::Store,
};

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
}

#[derive(Deserialize)]
struct FrontMatter {
    name: Option<String>,
    description: Option<String>,
    command: Option<Command>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Command {
    Argv(Vec<String>),
    Line(String),
}

/// Finds the definition a session of `workspace` named `agent` runs: the
/// database's for the workspace, else the database's for every workspace,
/// else the files ([`lookup`]).
pub async fn find(
    store: &impl Store,
    workspaces_dir: &Path,
    workspace: &str,
    agent: &str,
) -> Result<AgentDefinition, SessionError> {
    validate_slug("workspace_id", workspace)?;
    validate_slug("agent_name", agent)?;
    if let Some(stored) = store.find_agent(workspace, agent).await? {
        return Ok(stored.definition);
    }
    lookup(workspaces_dir, workspace, agent)
}

/// Finds and parses the file defining `agent` for `workspace`.
pub fn lookup(
    workspaces_dir: &Path,
    workspace: &str,
    agent: &str,
) -> Result<AgentDefinition, SessionError> {
    validate_slug("workspace_id", workspace)?;
    validate_slug("agent_name", agent)?;
    let file = format!("{agent}.md");
    let candidates = [
        workspaces_dir.join(workspace).join("Agents").join(&file),
        workspaces_dir.join("Agents").join(&file),
    ];
    for path in &candidates {
        match std::fs::read_to_string(path) {
            Ok(text) => return parse(agent, &text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(SessionError::Internal(format!(
                    "cannot read {}: {e}",
                    path.display()
                )));
            }
        }
    }
    Err(SessionError::refused(
        Reason::AgentNotFound,
        format!("agent not found: {agent}"),
    ))
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
        ];
        assert_eq!(allowed, tools.map(|t| format!("mcp__troupe__{t}")));
        let prompt = value("--append-system-prompt");
        assert!(
            prompt.contains("session sess_x in workspace demo, trust level direct"),
            "{prompt}"
        );
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
