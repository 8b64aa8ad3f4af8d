//! Agent definitions, looked up in this order ([`find`]): the database's
//! for the workspace, the database's for every workspace (applied by
//! operators, shared by every service on the database), then the files
//! `<agents-dir>/<workspace>/<name>.md`, else `<agents-dir>/<name>.md`
//! ([`DefinitionFiles::lookup`]). The agents directory is the operator's:
//! it is never mounted into a container, so no agent can write what a
//! session runs. A definition is never read from a workspace (the
//! `<workspaces-dir>/<workspace>/Agents/` of earlier releases is mounted at
//! `/workspace`, where agents write): one found there is refused, and the
//! refusal says where it belongs ([`DefinitionFiles::misplaced`]). Markdown with YAML front
//! matter in the format Claude Code uses for its agent files (`name`,
//! `description`, `tools`, `model`), plus `command`, the argv Troupe runs,
//! and `env`, variables of its own for that command ([`check_env`]: never one
//! of Troupe's); one parser ([`parse`]) reads files and applied definitions
//! alike. A session keeps what it runs as its row's `agent_command`
//! ([`Launch`]).
//!
//! Workspace ids and agent names are slugs ([`validate_slug`]), so they can
//! never name a path outside the workspaces directory.

use std::path::PathBuf;

pub use troupe_domain::agent::*;

use crate::{
    error::{Reason, SessionError},
    store::Store,
};

/// Finds the definition a session of `workspace` named `agent` runs: the
/// database's for the workspace, else the database's for every workspace,
/// else the files ([`DefinitionFiles::lookup`]).
pub async fn find(
    store: &impl Store,
    files: &DefinitionFiles,
    workspace: &str,
    agent: &str,
) -> Result<AgentDefinition, SessionError> {
    validate_slug("workspace_id", workspace)?;
    validate_slug("agent_name", agent)?;
    if let Some(stored) = store.find_agent(&workspace.into(), agent).await? {
        return Ok(stored.definition);
    }
    files.lookup(workspace, agent)
}

/// Where definition files are read from, and where they are not.
#[derive(Clone, Debug)]
pub struct DefinitionFiles {
    /// The operator's definitions (`--agents-dir`): `<dir>/<name>.md` for
    /// every workspace, `<dir>/<workspace>/<name>.md` for one.
    pub agents_dir: PathBuf,
    /// The workspaces (`--workspaces-dir`), mounted into their containers:
    /// only looked at to refuse a definition left there.
    pub workspaces_dir: PathBuf,
}

impl DefinitionFiles {
    /// The file of `agent` for `workspace` alone.
    pub fn workspace_file(&self, workspace: &str, agent: &str) -> PathBuf {
        self.agents_dir.join(workspace).join(format!("{agent}.md"))
    }

    /// The file of `agent` for every workspace.
    pub fn shared_file(&self, agent: &str) -> PathBuf {
        self.agents_dir.join(format!("{agent}.md"))
    }

    /// Finds and parses the file defining `agent` for `workspace`:
    /// `<agents-dir>/<workspace>/<name>.md`, else `<agents-dir>/<name>.md`.
    /// None there but one where agents can write it: refused, saying where
    /// it belongs.
    pub fn lookup(&self, workspace: &str, agent: &str) -> Result<AgentDefinition, SessionError> {
        validate_slug("workspace_id", workspace)?;
        validate_slug("agent_name", agent)?;
        for path in [
            self.workspace_file(workspace, agent),
            self.shared_file(agent),
        ] {
            match std::fs::read_to_string(&path) {
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
        if let Some(left) = self.misplaced(workspace, agent) {
            tracing::warn!(
                file = %left.display(),
                belongs = %self.workspace_file(workspace, agent).display(),
                "agent definition refused: it lies in a workspace, where agents can write it"
            );
            return Err(SessionError::refused(
                Reason::AgentNotFound,
                format!(
                    "agent not found: {agent}; a file Agents/{agent}.md lies in the workspaces \
                     directory, where agents can write it, so it is never run: the operator \
                     moves it to the agents directory (<agents-dir>/{workspace}/{agent}.md, \
                     or <agents-dir>/{agent}.md for every workspace) or applies it \
                     (troupe agent apply --workspace {workspace})"
                ),
            ));
        }
        Err(SessionError::refused(
            Reason::AgentNotFound,
            format!("agent not found: {agent}"),
        ))
    }

    /// A definition of `agent` left where earlier releases read it
    /// (`<workspaces-dir>/<workspace>/Agents/`, `<workspaces-dir>/Agents/`),
    /// if there is one.
    pub fn misplaced(&self, workspace: &str, agent: &str) -> Option<PathBuf> {
        let file = format!("{agent}.md");
        [
            self.workspaces_dir
                .join(workspace)
                .join("Agents")
                .join(&file),
            self.workspaces_dir.join("Agents").join(&file),
        ]
        .into_iter()
        .find(|path| path.symlink_metadata().is_ok())
    }

    /// Every definition file left where earlier releases read them: for the
    /// warning a service logs at start.
    pub fn all_misplaced(&self) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut dirs = vec![self.workspaces_dir.join("Agents")];
        if let Ok(entries) = std::fs::read_dir(&self.workspaces_dir) {
            dirs.extend(entries.flatten().map(|e| e.path().join("Agents")));
        }
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            found.extend(
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "md")),
            );
        }
        found.sort();
        found
    }
}
