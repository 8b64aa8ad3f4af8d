//! `ApplyAgent`, `ListAgents`, `RemoveAgent`: agent definitions kept in the
//! database, shared by every service on it. Operator only.

use troupe_proto::session as pb;

use super::{Inner, allowed, require_operator, view};
use crate::{
    agents,
    error::{Reason, SessionError},
    model::{Action, AgentScope, Caller, NewAgent, StoredAgent},
    store::Store,
};

/// Longest definition accepted, in bytes.
pub const MAX_DEFINITION_BYTES: usize = 64 * 1024;

/// The scope a request names, its workspace id checked.
fn scope(workspace_id: &str) -> Result<AgentScope, SessionError> {
    if !workspace_id.is_empty() {
        agents::validate_slug("workspace_id", workspace_id)?;
    }
    Ok(AgentScope::of(workspace_id))
}

pub async fn apply<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::ApplyAgentRequest,
) -> Result<pb::ApplyAgentResponse, SessionError> {
    require_operator(caller)?;
    let scope = scope(&req.workspace_id)?;
    agents::validate_slug("name", &req.name)?;
    super::check_len("definition", &req.definition, MAX_DEFINITION_BYTES)?;
    let definition = agents::parse(&req.name, &req.definition).map_err(|e| match e {
        SessionError::Refused {
            reason: Reason::AgentInvalid,
            message,
            ..
        } => SessionError::InvalidAgent(message),
        other => other,
    })?;
    let audit = allowed(
        caller,
        Action::ApplyAgent,
        &StoredAgent::audit_target(&scope, &req.name),
        definition.run.describe(),
    );
    let stored = inner
        .store
        .apply_agent(
            NewAgent {
                scope,
                definition,
                source: req.definition.clone(),
                applied_by: caller.principal(),
            },
            audit,
        )
        .await?;
    Ok(pb::ApplyAgentResponse {
        agent: Some(agent_view(stored)),
    })
}

pub async fn list<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::ListAgentsRequest,
) -> Result<pb::ListAgentsResponse, SessionError> {
    require_operator(caller)?;
    let scope = (!req.workspace_id.is_empty())
        .then(|| scope(&req.workspace_id))
        .transpose()?;
    let stored = inner.store.list_agents(scope.as_ref()).await?;
    Ok(pb::ListAgentsResponse {
        agents: stored.into_iter().map(agent_view).collect(),
    })
}

pub async fn remove<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::RemoveAgentRequest,
) -> Result<pb::RemoveAgentResponse, SessionError> {
    require_operator(caller)?;
    let scope = scope(&req.workspace_id)?;
    agents::validate_slug("name", &req.name)?;
    let target = StoredAgent::audit_target(&scope, &req.name);
    let audit = allowed(caller, Action::RemoveAgent, &target, String::new());
    let removed = inner.store.remove_agent(&scope, &req.name, audit).await?;
    let removed = removed.ok_or_else(|| {
        let place = match &scope {
            AgentScope::All => "for every workspace".to_owned(),
            AgentScope::Workspace(id) => format!("for workspace {id}"),
        };
        SessionError::refused(
            Reason::AgentNotFound,
            format!(
                "agent not found: no definition of {} {place} in the database",
                req.name
            ),
        )
    })?;
    Ok(pb::RemoveAgentResponse {
        agent: Some(agent_view(removed)),
    })
}

/// The audit log's name of the definition a request names.
pub fn target(workspace_id: &str, name: &str) -> String {
    StoredAgent::audit_target(&AgentScope::of(workspace_id), name)
}

fn agent_view(stored: StoredAgent) -> pb::AgentDefinition {
    pb::AgentDefinition {
        workspace_id: stored.scope.workspace_id().to_owned(),
        name: stored.definition.name,
        description: stored.definition.description.unwrap_or_default(),
        command: stored.definition.run.argv(),
        runtime: match &stored.definition.run {
            agents::Run::Runtime { runtime, .. } => runtime.to_string(),
            agents::Run::Command(_) => String::new(),
        },
        model: match stored.definition.run {
            agents::Run::Runtime { model, .. } => model.unwrap_or_default(),
            agents::Run::Command(_) => String::new(),
        },
        definition: stored.source,
        updated_at: Some(view::timestamp(stored.updated_at_ms)),
        updated_by: stored.updated_by.to_string(),
    }
}
