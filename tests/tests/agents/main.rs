//! Agent definitions kept in the database, over gRPC: operators apply, list,
//! replace and remove them; a create looks up the workspace's definition in
//! the database, then the one for every workspace, then the files; an
//! agent's token manages none of them; an invalid definition is refused
//! with the parser's message; a session keeps the command it was created
//! with. On SQLite, or PostgreSQL with `TROUPE_TEST_BACKEND=postgres`.

use tonic::Code;
use troupe_proto::session::{
    self as pb, ApplyAgentRequest, ListAgentsRequest, RemoveAgentRequest, TrustLevel,
};
use troupe_tests::{Client, TestServer, agent_definition, reason};

fn apply(workspace: &str, name: &str, command: &[&str]) -> ApplyAgentRequest {
    ApplyAgentRequest {
        workspace_id: workspace.to_owned(),
        name: name.to_owned(),
        definition: agent_definition(name, command),
    }
}

fn remove(workspace: &str, name: &str) -> RemoveAgentRequest {
    RemoveAgentRequest {
        workspace_id: workspace.to_owned(),
        name: name.to_owned(),
    }
}

async fn list(client: &mut Client, workspace: &str) -> Vec<(String, String, Vec<String>)> {
    client
        .list_agents(ListAgentsRequest {
            workspace_id: workspace.to_owned(),
        })
        .await
        .expect("list agents")
        .into_inner()
        .agents
        .into_iter()
        .map(|a| (a.workspace_id, a.name, a.command))
        .collect()
}

/// Creates a root session of `agent` in `workspace`; returns its id.
async fn create(
    server: &TestServer,
    workspace: &str,
    agent: &str,
) -> Result<String, tonic::Status> {
    let created = server
        .operator()
        .await
        .create_root_session(pb::CreateRootSessionRequest {
            workspace_id: workspace.to_owned(),
            trust_level: TrustLevel::Direct as i32,
            agent_name: agent.to_owned(),
            ..Default::default()
        })
        .await?;
    Ok(created.into_inner().session.expect("a session").session_id)
}

async fn audit_of(server: &TestServer, action: &str) -> Vec<pb::AuditEntry> {
    let entries = troupe_tests::audit_log(server, 10_000).await;
    entries.into_iter().filter(|e| e.action == action).collect()
}

fn strings(argv: &[&str]) -> Vec<String> {
    argv.iter().map(|a| (*a).to_owned()).collect()
}

mod definitions;
mod sessions;
