//! The console's JSON API. Reads and actions go through the service's gRPC
//! handlers as the operator ([`calls::as_operator`]); the few reads no RPC
//! serves whole (a workspace's sessions' usage, a session's messages with
//! their bodies) read the store, as the operator may read everything.

use std::{collections::BTreeMap, sync::Arc};

use axum::{
    Json,
    extract::{Path, Query, State, rejection::JsonRejection},
    http::HeaderMap,
    response::{IntoResponse, Response},
};
use serde::Deserialize;
use serde_json::{Value, json};
use troupe_proto::session::{self as pb, session_service_server::SessionService};

use super::{
    Console,
    calls::{ApiError, as_operator},
    json, no_store,
};
use troupe_domain::model::Action;
use troupe_store::Store;

/// Refused spawns a tree view is given at most (the newest).
const MAX_REFUSED: u32 = 1_000;
/// Messages and audit entries a session view shows.
const SESSION_VIEW_ROWS: u32 = 500;

fn ok(value: Value) -> Response {
    no_store(Json(value).into_response())
}

fn body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    body.map(|Json(b)| b)
        .map_err(|e| ApiError::invalid(format!("bad request body: {}", e.body_text())))
}

impl<S: Store> Console<S> {
    /// The spawns the rules refused to sessions of `workspace` after audit
    /// entry `after_id` (at most [`MAX_REFUSED`], newest kept), oldest
    /// first, and the audit entry to ask again after.
    async fn refused_spawns(
        &self,
        workspace: &str,
        after_id: u64,
    ) -> Result<(Vec<Value>, u64), ApiError> {
        let after_id = i64::try_from(after_id).unwrap_or(i64::MAX);
        let (mut rows, newest) = self
            .inner
            .store
            .refused_spawns(&workspace.into(), after_id, MAX_REFUSED)
            .await?;
        rows.reverse();
        let cursor = u64::try_from(newest.max(after_id)).unwrap_or_default();
        Ok((rows.into_iter().map(json::audit_row).collect(), cursor))
    }
}

/// `GET /api/workspaces`: each workspace with its active and total
/// sessions and its cost (its trees' totals).
pub async fn workspaces<S: Store>(
    State(console): State<Arc<Console<S>>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    console.signed(&headers).await?;
    let mut names: BTreeMap<String, ()> = BTreeMap::new();
    for (workspace, _, _) in console.inner.store.active_counts().await? {
        names.insert(workspace.into(), ());
    }
    // Workspace directories with no active session yet, and the workspaces
    // the agents directory has definitions for.
    for root in [
        &console.inner.workspaces_dir,
        &console.inner.agent_files.agents_dir,
    ] {
        let Ok(dir) = std::fs::read_dir(root) else {
            continue;
        };
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name != "Agents" && troupe_proto::names::is_slug(&name) && entry.path().is_dir() {
                names.insert(name, ());
            }
        }
    }
    let mut out = Vec::new();
    for workspace in names.into_keys() {
        let mut sessions = console.workspace_sessions(&workspace).await?;
        let active = sessions
            .iter()
            .filter(|s| !troupe_proto::status::is_ended(s.status()))
            .count();
        let mut roots: Vec<pb::Session> = sessions.drain(..).filter(|s| s.depth == 0).collect();
        console.with_usage(&mut roots).await?;
        let cost: u64 = roots
            .iter()
            .filter_map(|r| r.usage.as_ref())
            .map(|u| u.subtree_cost_pico_usd)
            .sum();
        out.push(json!({
            "workspace_id": workspace,
            "active": active,
            "trees": roots.len(),
            "cost_usd": troupe_proto::money::usd(cost),
        }));
    }
    Ok(ok(json!({ "workspaces": out })))
}

#[derive(Deserialize)]
pub struct TreeQuery {
    tree: Option<String>,
    /// The page to read: the `next` of the page before (none: the first).
    after: Option<String>,
}

/// `GET /api/workspaces/{workspace}/sessions[?tree=ID][&after=NEXT]`: a
/// page of the sessions (with usage, inbox and last progress), in the
/// order they were made (a parent before its children), and the `next`
/// page's token (null on the last); the event cursor read before the page;
/// on the first page, the spawns refused to the workspace's sessions and
/// the audit cursor to follow refusals from. The page follows events from
/// its first page's cursor once it has read every page: events after it
/// may repeat what a page shows, never miss anything.
pub async fn tree<S: Store>(
    State(console): State<Arc<Console<S>>>,
    Path(workspace): Path<String>,
    Query(query): Query<TreeQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    console.signed(&headers).await?;
    // Read before the sessions: events after it may repeat what the page
    // shows, never miss anything (the page applies a repeat idempotently).
    let shard = troupe_domain::shard::Shard::of(&workspace);
    let cursor = console
        .inner
        .store
        .event_heads()
        .await?
        .live(troupe_domain::shard::ShardSet::of(shard))
        .to_string();
    let tree = query.tree.as_deref().filter(|t| !t.is_empty());
    let after = query.after.unwrap_or_default();
    let page = console.tree_page(&workspace, tree, &after).await?;
    let mut answer = json!({
        "workspace_id": workspace,
        "cursor": cursor,
        "sessions": page.sessions,
        "next": page.next,
    });
    if after.is_empty() {
        let (refused, audit_cursor) = console.refused_spawns(&workspace, 0).await?;
        answer["refused"] = Value::Array(refused);
        answer["audit_cursor"] = json!(audit_cursor);
    }
    Ok(ok(answer))
}

#[derive(Deserialize)]
pub struct RefusedQuery {
    workspace: Option<String>,
    #[serde(default)]
    after: u64,
}

/// `GET /api/refused?workspace=WS&after=N`: spawns refused to sessions of
/// `WS` since audit entry `N` (a tree's page follows them with the
/// `audit_cursor` it was given).
pub async fn refused<S: Store>(
    State(console): State<Arc<Console<S>>>,
    Query(query): Query<RefusedQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    console.signed(&headers).await?;
    let workspace = query
        .workspace
        .filter(|w| !w.is_empty())
        .ok_or_else(|| ApiError::invalid("workspace: required (the tree's workspace)"))?;
    let (refused, audit_cursor) = console.refused_spawns(&workspace, query.after).await?;
    Ok(ok(
        json!({ "refused": refused, "audit_cursor": audit_cursor }),
    ))
}

#[derive(Deserialize)]
pub struct AgentsQuery {
    workspace: Option<String>,
}

/// `GET /api/agents[?workspace=WS]`: the agent definitions kept in the
/// database, and the names of the definition files a session of `WS`
/// could run (`<agents-dir>/WS/*.md`, `<agents-dir>/*.md`).
pub async fn agents<S: Store>(
    State(console): State<Arc<Console<S>>>,
    Query(query): Query<AgentsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    console.signed(&headers).await?;
    let workspace = query.workspace.unwrap_or_default();
    let request = as_operator(
        console.operator_token(),
        pb::ListAgentsRequest {
            workspace_id: workspace.clone(),
        },
    )?;
    let stored = console
        .service
        .list_agents(request)
        .await?
        .into_inner()
        .agents;
    let mut agents: Vec<Value> = stored
        .iter()
        .map(|a| json!({"workspace_id": a.workspace_id, "name": a.name, "description": a.description}))
        .collect();
    let dir = &console.inner.agent_files.agents_dir;
    let mut dirs = vec![(String::new(), dir.clone())];
    if troupe_proto::names::is_slug(&workspace) {
        dirs.push((workspace.clone(), dir.join(&workspace)));
    }
    for (scope, dir) in dirs {
        for name in agent_files(&dir) {
            agents.push(json!({"workspace_id": scope, "name": name, "file": true}));
        }
    }
    Ok(ok(json!({ "agents": agents })))
}

/// The agent names of the `*.md` files in `dir` (slugs only: the names a
/// create can give), sorted.
fn agent_files(dir: &std::path::Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".md").map(str::to_owned)
        })
        .filter(|name| troupe_proto::names::is_slug(name))
        .collect();
    names.sort();
    names
}

/// `GET /api/sessions/{id}`: a session, its children (the oldest
/// [`SESSION_VIEW_ROWS`], and how many there are), output tail, messages
/// in and out, audit entries and trace link.
pub async fn session<S: Store>(
    State(console): State<Arc<Console<S>>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    console.signed(&headers).await?;
    let request = as_operator(
        console.operator_token(),
        pb::GetSessionRequest {
            session_id: id.clone(),
        },
    )?;
    let got = console.service.get_session(request).await?.into_inner();
    let audit_request = as_operator(
        console.operator_token(),
        pb::ListAuditRequest {
            session_id: id.clone(),
            after_id: 0,
            limit: SESSION_VIEW_ROWS,
        },
    )?;
    let audit = console
        .service
        .list_audit(audit_request)
        .await?
        .into_inner()
        .entries;
    let messages = console
        .inner
        .store
        .session_messages(&id.as_str().into(), SESSION_VIEW_ROWS)
        .await?;
    let trace = console.settings.trace_url.as_ref();
    let result = got.result.unwrap_or_default();
    Ok(ok(json!({
        "session": got.session.as_ref().map(|s| json::session(s, trace)),
        // The oldest children: the tree's pages have them all.
        "children": got.children.iter().take(SESSION_VIEW_ROWS as usize)
            .map(|s| json::session(s, trace)).collect::<Vec<_>>(),
        "children_count": got.children.len(),
        "inbox_count": got.inbox_count,
        "unread_count": got.unread_count,
        "output_tail": result.output_tail,
        "messages": messages.iter().map(json::message).collect::<Vec<_>>(),
        "audit": audit.iter().map(json::audit).collect::<Vec<_>>(),
    })))
}

#[derive(Deserialize)]
pub struct SendBody {
    message: String,
    #[serde(default)]
    request_id: String,
}

/// `POST /api/sessions/{id}/messages {"message", "request_id"?}`: `SendMessage`.
pub async fn send<S: Store>(
    State(console): State<Arc<Console<S>>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    payload: Result<Json<SendBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let signed = console.acting(&headers).await?;
    let payload = body(payload)?;
    let request = as_operator(
        console.operator_token(),
        pb::SendMessageRequest {
            session_id: id.clone(),
            message: payload.message,
            request_id: payload.request_id,
        },
    )?;
    let result = console
        .service
        .send_message(request)
        .await
        .map_err(ApiError::from);
    console
        .audit_console(
            &signed,
            Action::ConsoleSendMessage,
            &id,
            result.as_ref().map(|_| ()),
        )
        .await;
    let sent = result?.into_inner();
    Ok(ok(json!({
        "message_id": sent.message_id,
        "sequence": sent.sequence,
        "delivery": pb::DeliveryStatus::try_from(sent.delivery)
            .map(|d| d.as_str_name().trim_start_matches("DELIVERY_STATUS_").to_lowercase())
            .unwrap_or_default(),
    })))
}

#[derive(Deserialize)]
pub struct TerminateBody {
    #[serde(default)]
    reason: String,
}

/// `POST /api/sessions/{id}/terminate {"reason"?}`: `TerminateSession`,
/// the session and its whole subtree.
pub async fn terminate<S: Store>(
    State(console): State<Arc<Console<S>>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    payload: Result<Json<TerminateBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let signed = console.acting(&headers).await?;
    let payload = body(payload)?;
    let request = as_operator(
        console.operator_token(),
        pb::TerminateSessionRequest {
            session_id: id.clone(),
            reason: payload.reason,
        },
    )?;
    let result = console
        .service
        .terminate_session(request)
        .await
        .map_err(ApiError::from);
    console
        .audit_console(
            &signed,
            Action::ConsoleTerminateSession,
            &id,
            result.as_ref().map(|_| ()),
        )
        .await;
    let ended = result?.into_inner();
    Ok(ok(
        json!({ "terminated_session_ids": ended.terminated_session_ids }),
    ))
}

#[derive(Deserialize)]
pub struct CreateBody {
    workspace_id: String,
    agent_name: String,
    #[serde(default)]
    title: String,
    #[serde(default)]
    message: String,
    /// `direct` or `sandboxed` (the default).
    #[serde(default)]
    trust_level: String,
    #[serde(default)]
    request_id: String,
}

/// `POST /api/sessions {...}`: `CreateRootSession`. The new session's token
/// stays in the service: the answer is the session alone.
pub async fn create_root<S: Store>(
    State(console): State<Arc<Console<S>>>,
    headers: HeaderMap,
    payload: Result<Json<CreateBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let signed = console.acting(&headers).await?;
    let payload = body(payload)?;
    let trust = match payload.trust_level.as_str() {
        "" => pb::TrustLevel::Sandboxed,
        text => troupe_proto::trust::parse(text).ok_or_else(|| {
            ApiError::invalid(format!("trust_level: {text:?} is not direct or sandboxed"))
        })?,
    };
    let request = as_operator(
        console.operator_token(),
        pb::CreateRootSessionRequest {
            workspace_id: payload.workspace_id.clone(),
            trust_level: trust as i32,
            title: payload.title,
            agent_name: payload.agent_name,
            initial_message: payload.message,
            request_id: payload.request_id,
            budget: None,
            writable_paths: Vec::new(),
        },
    )?;
    let result = console
        .service
        .create_root_session(request)
        .await
        .map_err(ApiError::from);
    let target = match &result {
        Ok(created) => created
            .get_ref()
            .session
            .as_ref()
            .map(|s| s.session_id.clone())
            .unwrap_or_default(),
        Err(_) => payload.workspace_id,
    };
    console
        .audit_console(
            &signed,
            Action::ConsoleCreateRootSession,
            &target,
            result.as_ref().map(|_| ()),
        )
        .await;
    let created = result?.into_inner();
    let trace = console.settings.trace_url.as_ref();
    Ok(ok(json!({
        "session": created.session.as_ref().map(|s| json::session(s, trace)),
    })))
}
