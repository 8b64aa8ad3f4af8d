//! `troupe agent apply|list|rm`: the agent definitions kept in the
//! database, shared by every session service on it. Operator only.

use anyhow::Context;
use serde_json::Value;
use troupe_proto::session::{
    AgentDefinition, ApplyAgentRequest, ListAgentsRequest, RemoveAgentRequest,
};

use crate::{
    Ctx,
    cli::{AgentApplyArgs, AgentCommand, AgentListArgs, AgentRmArgs},
    out, render, table,
};

/// Runs one `troupe agent ...` command.
pub async fn run(ctx: &mut Ctx, command: &AgentCommand) -> anyhow::Result<()> {
    match command {
        AgentCommand::Apply(args) => apply(ctx, args).await,
        AgentCommand::List(args) => list(ctx, args).await,
        AgentCommand::Rm(args) => remove(ctx, args).await,
    }
}

async fn apply(ctx: &mut Ctx, args: &AgentApplyArgs) -> anyhow::Result<()> {
    let name = args
        .file
        .file_stem()
        .and_then(|stem| stem.to_str())
        .with_context(|| {
            format!(
                "{}: the file's name (NAME.md) names the agent",
                args.file.display()
            )
        })?
        .to_owned();
    let definition = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let request = ApplyAgentRequest {
        workspace_id: args.workspace.clone().unwrap_or_default(),
        name,
        definition,
    };
    let applied = ctx
        .call(&request, |mut c, m| async move { c.apply_agent(m).await })
        .await?
        .agent
        .unwrap_or_default();
    if ctx.json {
        return out::json(&render::agent(&applied));
    }
    out::text(&format!(
        "applied agent {} {}\n{}\n",
        applied.name,
        place(&applied.workspace_id),
        command_text(&applied)
    ))
}

async fn list(ctx: &mut Ctx, args: &AgentListArgs) -> anyhow::Result<()> {
    let request = ListAgentsRequest {
        workspace_id: args.workspace.clone().unwrap_or_default(),
    };
    let agents = ctx
        .call(&request, |mut c, m| async move { c.list_agents(m).await })
        .await?
        .agents;
    if ctx.json {
        return out::json(&Value::Array(agents.iter().map(render::agent).collect()));
    }
    let rows: Vec<Vec<String>> = agents
        .iter()
        .map(|a| {
            vec![
                scope_column(&a.workspace_id).to_owned(),
                a.name.clone(),
                command_text(a),
                render::time_seconds(a.updated_at.as_ref()),
                render::or_dash(&a.description).to_owned(),
            ]
        })
        .collect();
    out::text(&table::render(
        &["WORKSPACE", "NAME", "RUNS", "UPDATED", "DESCRIPTION"],
        &rows,
    ))
}

async fn remove(ctx: &mut Ctx, args: &AgentRmArgs) -> anyhow::Result<()> {
    let request = RemoveAgentRequest {
        workspace_id: args.workspace.clone().unwrap_or_default(),
        name: args.name.clone(),
    };
    let removed = ctx
        .call(&request, |mut c, m| async move { c.remove_agent(m).await })
        .await?
        .agent
        .unwrap_or_default();
    if ctx.json {
        return out::json(&render::agent(&removed));
    }
    out::text(&format!(
        "removed agent {} {}\n",
        removed.name,
        place(&removed.workspace_id)
    ))
}

/// The workspace column: `*` for every workspace.
fn scope_column(workspace_id: &str) -> &str {
    if workspace_id.is_empty() {
        "*"
    } else {
        workspace_id
    }
}

fn place(workspace_id: &str) -> String {
    if workspace_id.is_empty() {
        "for every workspace".to_owned()
    } else {
        format!("for workspace {workspace_id}")
    }
}

/// What it runs as one line: `runtime codex, model m`, or `command ` and
/// the argv, each argument JSON-quoted when it needs it.
fn command_text(agent: &AgentDefinition) -> String {
    if !agent.runtime.is_empty() {
        return match agent.model.as_str() {
            "" => format!("runtime {}", agent.runtime),
            model => format!("runtime {}, model {model}", agent.runtime),
        };
    }
    let argv = agent
        .command
        .iter()
        .map(|arg| {
            let plain = !arg.is_empty()
                && arg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "/._-=:,@+".contains(c));
            if plain {
                arg.clone()
            } else {
                Value::String(arg.clone()).to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    format!("command {argv}")
}
