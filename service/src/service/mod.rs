//! The `troupe.session.v1.SessionService` implementation: authentication,
//! then one module per RPC (`agents` holds the three of agent definitions). Every handler reads the caller from its token
//! ([`Service::authenticate`]), applies the rules of [`crate::policy`], and
//! audits its decision.

mod agents;
mod audit;
mod checks;
mod create;
mod finish;
mod fleet;
mod get;
mod groups;
pub mod identity;
mod list;
mod message;
mod progress;
mod reply;
mod spans;
mod terminate;
mod token;
pub mod view;
mod watch;

use std::{path::PathBuf, pin::Pin, sync::Arc, time::Instant};

use futures::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use troupe_proto::session::{self as pb, session_service_server::SessionService};
use troupe_telemetry::{self as telemetry, LifeSpan};

use checks::{allowed, check_len, idempotency, require_operator};
pub use finish::Finishing;
use identity::{Lapse, identify, identify_finishing};
pub use spans::makes_own_span;
use spans::{caller_span, spawn_span, spawning};

use crate::{
    auth::{Tokens, bearer},
    driver::Driver,
    error::SessionError,
    metrics,
    model::{Action, AuditRecord, Caller, Principal},
    store::Store,
};

pub use troupe_domain::limits::{MAX_MESSAGE_BYTES, MAX_SHORT_TEXT};

/// Shared state of the service.
pub struct Inner<S> {
    pub store: S,
    pub tokens: Arc<Tokens>,
    /// The spawn and message limits in force, the database's
    /// ([`crate::rules`]).
    pub rules: crate::rules::Rules,
    pub workspaces_dir: PathBuf,
    /// Where agent definition files are read from.
    pub agent_files: crate::agents::DefinitionFiles,
    /// Cancelled at shutdown; ends open watch streams.
    pub shutdown: CancellationToken,
    /// Starts and follows agents; `None` without a runner.
    pub driver: Option<Arc<Driver<S>>>,
    /// How long a request id replays its first call's answer.
    pub request_id_retention: std::time::Duration,
    /// How sessions finish their task (`FinishSession`).
    pub finishing: Finishing,
}

/// The gRPC service.
pub struct Service<S> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for Service<S> {
    fn clone(&self) -> Self {
        Service {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S: Store> Service<S> {
    pub fn new(inner: Inner<S>) -> Self {
        Service {
            inner: Arc::new(inner),
        }
    }

    /// The state the service shares with the model gateway.
    pub fn shared(&self) -> Arc<Inner<S>> {
        self.inner.clone()
    }

    /// Establishes the caller from the bearer token and the database.
    /// Refusals are audited.
    async fn authenticate<T>(
        &self,
        request: &Request<T>,
        action: crate::model::Action,
    ) -> Result<Caller, SessionError> {
        Ok(self.identified(request, action).await?.0)
    }

    /// [`Service::authenticate`], for a call that lasts: with what the
    /// caller's standing rests on, so the call can end when it lapses.
    async fn authenticate_lasting<T>(
        &self,
        request: &Request<T>,
        action: crate::model::Action,
    ) -> Result<(Caller, Lapse), SessionError> {
        let (caller, expires_at) = self.identified(request, action).await?;
        let token = bearer(request.metadata())?;
        let lapse = Lapse::of(&caller, token, expires_at);
        Ok((caller, lapse))
    }

    /// The caller and its token's expiry; refusals audited.
    async fn identified<T>(
        &self,
        request: &Request<T>,
        action: crate::model::Action,
    ) -> Result<(Caller, Option<u64>), SessionError> {
        let identified = match bearer(request.metadata()) {
            Ok(token) if action == Action::FinishSession => {
                identify_finishing(&self.inner, token).await
            }
            Ok(token) => identify(&self.inner, token).await,
            Err(missing) => Err(missing),
        };
        if let Err(err) = &identified {
            self.audit(AuditRecord {
                caller: Principal::Anonymous,
                action,
                target: String::new(),
                allowed: false,
                reason: err.reason().as_str().to_owned(),
                detail: err.to_string(),
            })
            .await;
        }
        identified
    }

    /// Appends an audit entry; a failure is logged, never returned.
    async fn audit(&self, record: AuditRecord) {
        if let Err(e) = self.inner.store.append_audit(record).await {
            tracing::error!(error = %e, "audit append failed");
        }
    }

    /// Audits a decision made outside a store transaction: every refusal,
    /// and the allowed calls of the actions whose allowed calls are audited
    /// ([`Action::audits_allowed`]: the reads).
    async fn audit_outcome<T>(
        &self,
        caller: &Caller,
        action: Action,
        target: &str,
        result: &Result<T, SessionError>,
    ) {
        let (allowed, reason, detail) = match result {
            Ok(_) if action.audits_allowed() => (true, "OK".to_owned(), String::new()),
            Ok(_) => return,
            Err(e) => (false, e.reason().as_str().to_owned(), e.to_string()),
        };
        self.audit(AuditRecord {
            caller: caller.principal(),
            action,
            target: target.to_owned(),
            allowed,
            reason,
            detail,
        })
        .await;
    }

    /// One call of `action`: the caller from its token (a refusal
    /// audited), then `run`, then the audit entry of what it decided
    /// outside a store transaction (see [`Service::audit_outcome`]),
    /// naming `target`.
    pub(super) async fn call<Req, Resp>(
        &self,
        request: Request<Req>,
        action: Action,
        target: impl FnOnce(&Caller, &Req) -> String,
        run: impl AsyncFnOnce(&Inner<S>, &Caller, &Req) -> Result<Resp, SessionError>,
    ) -> Result<Response<Resp>, Status> {
        let caller = self.authenticate(&request, action).await?;
        let req = request.into_inner();
        let result = run(&self.inner, &caller, &req).await;
        let target = target(&caller, &req);
        self.audit_outcome(&caller, action, &target, &result).await;
        Ok(Response::new(result?))
    }

    /// `CreateRootSession`, in its spawn span (the request's span).
    async fn create_root(
        &self,
        request: Request<pb::CreateRootSessionRequest>,
    ) -> Result<pb::CreateRootSessionResponse, SessionError> {
        let span = spawn_span("create_root", caller_span(&request).as_ref());
        let spawn = async move {
            let caller = self
                .authenticate(&request, Action::CreateRootSession)
                .await?;
            let req = request.into_inner();
            let result = create::root(&self.inner, &caller, &req).await;
            let target = &req.workspace_id;
            self.audit_outcome(&caller, Action::CreateRootSession, target, &result)
                .await;
            result
        };
        spawning(span, spawn, |r| r.session.as_ref()).await
    }

    /// `CreateSession`, in its spawn span (the request's span), under the
    /// parent's life.
    async fn create_child(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Result<pb::CreateSessionResponse, SessionError> {
        let call = caller_span(&request);
        let span = spawn_span("spawn", call.as_ref());
        let spawn = async move {
            let (caller, expires_at) = self.identified(&request, Action::CreateSession).await?;
            // Only a sync create lasts: it waits on its child.
            let lapse = match request.get_ref().mode() {
                pb::ExecutionMode::Sync => {
                    Lapse::of(&caller, bearer(request.metadata())?, expires_at)
                }
                _ => Lapse::Never,
            };
            let parent = &request.get_ref().parent_session_id;
            if let Some(life) = self.parent_life(&caller, parent).await {
                // Before anything starts the spawn span: its parent is final then.
                life.adopt(&tracing::Span::current(), call.as_ref());
            }
            let req = request.into_inner();
            let result = create::child(&self.inner, &caller, &lapse, &req).await;
            let target = match (&caller, req.parent_session_id.as_str()) {
                (Caller::Session(me), "") => me.session_id.clone(),
                (_, parent) => parent.into(),
            };
            self.audit_outcome(&caller, Action::CreateSession, &target, &result)
                .await;
            result
        };
        spawning(span, spawn, |r| r.session.as_ref()).await
    }

    /// The life span of the session a spawn is for (the caller's own, or
    /// the one an operator names), so the spawn joins its tree's trace.
    async fn parent_life(&self, caller: &Caller, named: &str) -> Option<LifeSpan> {
        if !telemetry::exporting() {
            return None;
        }
        match caller {
            Caller::Session(me) => me.trace,
            Caller::Operator => {
                self.inner
                    .store
                    .get_session(&named.into())
                    .await
                    .ok()??
                    .trace
            }
        }
    }
}

/// The caller's own session (an operator's call names none).
fn own_id(caller: &Caller) -> String {
    match caller {
        Caller::Session(me) => me.session_id.to_string(),
        Caller::Operator => String::new(),
    }
}

/// The caller's parent session, if it has one.
fn parent_id(caller: &Caller) -> String {
    match caller {
        Caller::Session(me) => me
            .parent_session_id
            .as_deref()
            .unwrap_or_default()
            .to_owned(),
        Caller::Operator => String::new(),
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::SessionEvent, Status>> + Send + Sync>>;

#[tonic::async_trait]
impl<S: Store> SessionService for Service<S> {
    async fn create_root_session(
        &self,
        request: Request<pb::CreateRootSessionRequest>,
    ) -> Result<Response<pb::CreateRootSessionResponse>, Status> {
        let started = Instant::now();
        let result = self.create_root(request).await;
        metrics::spawn(metrics::Spawn::Root, started.elapsed(), &result);
        Ok(Response::new(result?))
    }

    async fn create_session(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::CreateSessionResponse>, Status> {
        let started = Instant::now();
        let result = self.create_child(request).await;
        metrics::spawn(metrics::Spawn::Child, started.elapsed(), &result);
        Ok(Response::new(result?))
    }

    #[tracing::instrument(name = "send", skip_all)]
    async fn send_message(
        &self,
        request: Request<pb::SendMessageRequest>,
    ) -> Result<Response<pb::SendMessageResponse>, Status> {
        self.call(
            request,
            Action::SendMessage,
            |_, req| req.session_id.clone(),
            message::send,
        )
        .await
    }

    #[tracing::instrument(name = "list", skip_all)]
    async fn list_workspace_sessions(
        &self,
        request: Request<pb::ListWorkspaceSessionsRequest>,
    ) -> Result<Response<pb::ListWorkspaceSessionsResponse>, Status> {
        self.call(
            request,
            Action::ListWorkspaceSessions,
            |_, req| req.workspace_id.clone(),
            list::sessions,
        )
        .await
    }

    #[tracing::instrument(name = "get", skip_all)]
    async fn get_session(
        &self,
        request: Request<pb::GetSessionRequest>,
    ) -> Result<Response<pb::GetSessionResponse>, Status> {
        self.call(
            request,
            Action::GetSession,
            |_, req| req.session_id.clone(),
            get::session,
        )
        .await
    }

    #[tracing::instrument(name = "terminate", skip_all)]
    async fn terminate_session(
        &self,
        request: Request<pb::TerminateSessionRequest>,
    ) -> Result<Response<pb::TerminateSessionResponse>, Status> {
        self.call(
            request,
            Action::TerminateSession,
            |_, req| req.session_id.clone(),
            terminate::session,
        )
        .await
    }

    type WatchSessionsStream = EventStream;

    #[tracing::instrument(name = "watch", skip_all)]
    async fn watch_sessions(
        &self,
        request: Request<pb::WatchSessionsRequest>,
    ) -> Result<Response<Self::WatchSessionsStream>, Status> {
        let (caller, lapse) = self
            .authenticate_lasting(&request, Action::WatchSessions)
            .await?;
        let req = request.into_inner();
        let result = watch::start(Arc::clone(&self.inner), &caller, lapse, &req).await;
        let target = [&req.session_id, &req.tree_id, &req.workspace_id]
            .into_iter()
            .find(|t| !t.is_empty())
            .cloned()
            .unwrap_or_default();
        self.audit_outcome(&caller, Action::WatchSessions, &target, &result)
            .await;
        Ok(Response::new(result?))
    }

    #[tracing::instrument(name = "issue_token", skip_all)]
    async fn issue_session_token(
        &self,
        request: Request<pb::IssueSessionTokenRequest>,
    ) -> Result<Response<pb::IssueSessionTokenResponse>, Status> {
        self.call(
            request,
            Action::IssueSessionToken,
            |_, req| req.session_id.clone(),
            token::issue,
        )
        .await
    }

    #[tracing::instrument(name = "progress", skip_all)]
    async fn report_progress(
        &self,
        request: Request<pb::ReportProgressRequest>,
    ) -> Result<Response<pb::ReportProgressResponse>, Status> {
        self.call(
            request,
            Action::ReportProgress,
            |caller, _| own_id(caller),
            progress::report,
        )
        .await
    }

    #[tracing::instrument(name = "finish", skip_all)]
    async fn finish_session(
        &self,
        request: Request<pb::FinishSessionRequest>,
    ) -> Result<Response<pb::FinishSessionResponse>, Status> {
        self.call(
            request,
            Action::FinishSession,
            |caller, _| own_id(caller),
            finish::session,
        )
        .await
    }

    #[tracing::instrument(name = "reply", skip_all)]
    async fn reply_to_parent(
        &self,
        request: Request<pb::ReplyToParentRequest>,
    ) -> Result<Response<pb::ReplyToParentResponse>, Status> {
        self.call(
            request,
            Action::ReplyToParent,
            |caller, _| parent_id(caller),
            reply::send,
        )
        .await
    }

    #[tracing::instrument(name = "broadcast", skip_all)]
    async fn broadcast(
        &self,
        request: Request<pb::BroadcastRequest>,
    ) -> Result<Response<pb::BroadcastResponse>, Status> {
        self.call(
            request,
            Action::Broadcast,
            |_, req| req.workspace_id.clone(),
            groups::broadcast,
        )
        .await
    }

    #[tracing::instrument(name = "group", skip_all)]
    async fn create_group(
        &self,
        request: Request<pb::CreateGroupRequest>,
    ) -> Result<Response<pb::CreateGroupResponse>, Status> {
        self.call(
            request,
            Action::CreateGroup,
            |_, req| req.name.clone(),
            groups::create,
        )
        .await
    }

    #[tracing::instrument(name = "group", skip_all)]
    async fn add_group_members(
        &self,
        request: Request<pb::AddGroupMembersRequest>,
    ) -> Result<Response<pb::AddGroupMembersResponse>, Status> {
        self.call(
            request,
            Action::AddGroupMembers,
            |_, req| req.group.clone(),
            groups::add,
        )
        .await
    }

    #[tracing::instrument(name = "post", skip_all)]
    async fn post_to_group(
        &self,
        request: Request<pb::PostToGroupRequest>,
    ) -> Result<Response<pb::PostToGroupResponse>, Status> {
        self.call(
            request,
            Action::PostToGroup,
            |_, req| req.group.clone(),
            groups::post,
        )
        .await
    }

    #[tracing::instrument(name = "group", skip_all)]
    async fn list_groups(
        &self,
        request: Request<pb::ListGroupsRequest>,
    ) -> Result<Response<pb::ListGroupsResponse>, Status> {
        self.call(
            request,
            Action::ListGroups,
            |_, req| req.workspace_id.clone(),
            groups::list,
        )
        .await
    }

    #[tracing::instrument(name = "audit", skip_all)]
    async fn list_audit(
        &self,
        request: Request<pb::ListAuditRequest>,
    ) -> Result<Response<pb::ListAuditResponse>, Status> {
        self.call(
            request,
            Action::ListAudit,
            |_, req| req.session_id.clone(),
            audit::list,
        )
        .await
    }

    #[tracing::instrument(name = "apply_agent", skip_all)]
    async fn apply_agent(
        &self,
        request: Request<pb::ApplyAgentRequest>,
    ) -> Result<Response<pb::ApplyAgentResponse>, Status> {
        self.call(
            request,
            Action::ApplyAgent,
            |_, req| agents::target(&req.workspace_id, &req.name),
            agents::apply,
        )
        .await
    }

    #[tracing::instrument(name = "list_agents", skip_all)]
    async fn list_agents(
        &self,
        request: Request<pb::ListAgentsRequest>,
    ) -> Result<Response<pb::ListAgentsResponse>, Status> {
        self.call(
            request,
            Action::ListAgents,
            |_, req| req.workspace_id.clone(),
            agents::list,
        )
        .await
    }

    #[tracing::instrument(name = "remove_agent", skip_all)]
    async fn remove_agent(
        &self,
        request: Request<pb::RemoveAgentRequest>,
    ) -> Result<Response<pb::RemoveAgentResponse>, Status> {
        self.call(
            request,
            Action::RemoveAgent,
            |_, req| agents::target(&req.workspace_id, &req.name),
            agents::remove,
        )
        .await
    }
}
