//! `CreateRootSession` and `CreateSession`.

use troupe_proto::session as pb;
use troupe_telemetry::LifeSpan;

use super::{
    Inner, MAX_MESSAGE_BYTES, MAX_SHORT_TEXT, allowed, check_len, idempotency, identity::Lapse,
    require_operator, view,
};
use crate::{
    agents,
    error::{Reason, SessionError},
    model::{
        Action, Budget, Caller, Cost, NewMessage, NewSession, ParentEnd, SessionId, Trust,
        WriteScope,
    },
    policy,
    store::{Created, Store},
};

/// Fields shared by both creates, validated.
struct Spec {
    title: String,
    agent_command: String,
    initial_message: Option<String>,
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

async fn spec<S: Store>(
    inner: &Inner<S>,
    workspace: &str,
    agent: &str,
    title: &str,
    initial_message: &str,
) -> Result<Spec, SessionError> {
    agents::validate_slug("workspace_id", workspace)?;
    agents::validate_slug("agent_name", agent)?;
    check_len("title", title, MAX_SHORT_TEXT)?;
    check_len("initial_message", initial_message, MAX_MESSAGE_BYTES)?;
    let definition = agents::find(&inner.store, &inner.agent_files, workspace, agent).await?;
    let agent_command = serde_json::to_string(&agents::Launch::of(&definition))
        .map_err(|e| SessionError::Internal(e.to_string()))?;
    Ok(Spec {
        title: if title.trim().is_empty() {
            agent.to_owned()
        } else {
            title.to_owned()
        },
        agent_command,
        initial_message: (!initial_message.is_empty()).then(|| initial_message.to_owned()),
    })
}

/// Reads a create's budget: each dimension as given (at most `i64::MAX`, as
/// stored); none given is no budget.
fn budget(given: Option<&pb::Budget>) -> Result<Budget, SessionError> {
    let Some(b) = given else {
        return Ok(Budget::default());
    };
    let fits = |n: Option<u64>| match n {
        Some(n) if i64::try_from(n).is_err() => Err(SessionError::invalid(
            "budget",
            format!("{n} is too large (at most {})", i64::MAX),
        )),
        _ => Ok(n),
    };
    Ok(Budget {
        cost: fits(b.cost_pico_usd)?.map(Cost),
        tokens: fits(b.tokens)?,
        calls: fits(b.model_calls)?,
        wall_ms: fits(b.wall_ms)?,
    })
}

/// Reads a create's `writable_paths` (malformed: `INVALID_ARGUMENT`).
fn write_scope(given: &[String]) -> Result<WriteScope, SessionError> {
    WriteScope::parse(given).map_err(|why| SessionError::invalid("writable_paths", why))
}

/// How a create's audit entry names a scope: nothing when unscoped.
fn scope_note(scope: &WriteScope) -> String {
    if scope.is_unscoped() {
        String::new()
    } else {
        format!(" writable {scope}")
    }
}

/// A budget as a create's request-id payload spells it.
fn budget_key(b: &Budget) -> String {
    let n = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    format!(
        "{}/{}/{}/{}",
        n(b.cost.map(|c| c.0)),
        n(b.tokens),
        n(b.calls),
        n(b.wall_ms)
    )
}

/// The created session as the caller may see it, with its account.
async fn created_view<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    session: &crate::model::SessionRow,
) -> Result<pb::Session, SessionError> {
    let mut view = view::session(caller, session);
    if let Some(account) = inner.store.account(&session.session_id).await? {
        view::with_account(&mut view, &account);
    }
    Ok(view)
}

fn new_session(
    caller: &Caller,
    workspace: &str,
    agent: &str,
    trust: Trust,
    spec: Spec,
    notify_parent: bool,
    budget: Budget,
) -> NewSession {
    NewSession {
        session_id: new_id("sess").into(),
        workspace_id: workspace.into(),
        trust,
        agent_name: agent.to_owned(),
        agent_command: spec.agent_command,
        title: spec.title,
        created_by: caller.principal(),
        // Called inside the spawn span: the new session's life is its child.
        trace: LifeSpan::plan(),
        initial_message: spec.initial_message.map(|body| NewMessage {
            message_id: new_id("msg"),
            sender: caller.principal(),
            body,
        }),
        notify_parent,
        budget,
        // Set by the caller, once checked.
        write_scope: WriteScope::unscoped(),
        on_parent_end: ParentEnd::Terminate,
    }
}

pub async fn root<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::CreateRootSessionRequest,
) -> Result<pb::CreateRootSessionResponse, SessionError> {
    require_operator(caller)?;
    let level = pb::TrustLevel::try_from(req.trust_level)
        .map_err(|_| SessionError::invalid("trust_level", "unknown trust level"))?;
    let trust = Trust::from_proto(level).unwrap_or(Trust::Sandboxed);
    let budget = budget(req.budget.as_ref())?;
    let scope = write_scope(&req.writable_paths)?;
    let spec = spec(
        inner,
        &req.workspace_id,
        &req.agent_name,
        &req.title,
        &req.initial_message,
    )
    .await?;
    let budget_key = budget_key(&budget);
    let scope_key = scope.to_strings().join(":");
    let mut payload = vec![
        &req.workspace_id,
        trust.as_str(),
        &req.title,
        &req.agent_name,
        &req.initial_message,
        budget_key.as_str(),
    ];
    // Unscoped creates keep the payload they had before scopes.
    if !scope.is_unscoped() {
        payload.push(&scope_key);
    }
    let idem = idempotency(
        caller,
        Action::CreateRootSession,
        &req.request_id,
        &payload,
        inner.request_id_retention,
    )?;
    // A sandboxed root given no scope writes in the sandboxed area.
    let scope = policy::run_scope(trust, scope);
    let audit_note = scope_note(&scope).trim_start().to_owned();
    let new = NewSession {
        write_scope: scope,
        ..new_session(
            caller,
            &req.workspace_id,
            &req.agent_name,
            trust,
            spec,
            false,
            budget,
        )
    };
    let audit = allowed(
        caller,
        Action::CreateRootSession,
        &new.session_id,
        audit_note,
    );
    let limits = inner.rules.limits();
    let created = inner
        .store
        .create_root(new, idem, audit, &|active| {
            policy::admit_root(active, &limits)
        })
        .await?;
    let fresh = matches!(created, Created::New { .. });
    let (session, quota) = resolve(inner, created).await?;
    if fresh && let Some(driver) = &inner.driver {
        driver.launch(session.clone());
    }
    let (token, exp) = inner.tokens.mint(&session.session_id)?;
    Ok(pb::CreateRootSessionResponse {
        session: Some(created_view(inner, caller, &session).await?),
        session_token: token,
        token_expires_at: Some(view::timestamp(exp as i64 * 1000)),
        quota: Some(view::quota(quota)),
    })
}

pub async fn child<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    lapse: &Lapse,
    req: &pb::CreateSessionRequest,
) -> Result<pb::CreateSessionResponse, SessionError> {
    let parent = match caller {
        Caller::Operator => {
            if req.parent_session_id.is_empty() {
                return Err(SessionError::invalid(
                    "parent_session_id",
                    "an operator must name the parent session (CreateRootSession starts a new tree)",
                ));
            }
            inner
                .store
                .get_session(&req.parent_session_id.as_str().into())
                .await?
                .ok_or_else(|| SessionError::not_found(&req.parent_session_id))?
        }
        Caller::Session(me) => {
            if !req.parent_session_id.is_empty() && req.parent_session_id != me.session_id {
                return Err(SessionError::refused(
                    Reason::ParentOverrideForbidden,
                    "agents create children of their own session only; leave parent_session_id empty",
                ));
            }
            (**me).clone()
        }
    };
    let level = pb::TrustLevel::try_from(req.trust_level)
        .map_err(|_| SessionError::invalid("trust_level", "unknown trust level"))?;
    let trust = policy::child_trust(parent.trust, Trust::from_proto(level))?;
    let scope = policy::child_scope(
        (parent.trust, &parent.write_scope),
        trust,
        write_scope(&req.writable_paths)?,
    )?;
    let budget = budget(req.budget.as_ref())?;
    let on_parent_end = pb::ParentEndPolicy::try_from(req.on_parent_end)
        .map(ParentEnd::from_proto)
        .map_err(|_| {
            SessionError::invalid(
                "on_parent_end",
                "unknown parent-end policy (terminate, abandon or notify)",
            )
        })?;
    let mode = pb::ExecutionMode::try_from(req.mode)
        .map_err(|_| SessionError::invalid("mode", "unknown execution mode"))?;
    if mode == pb::ExecutionMode::Sync {
        let runs = match &inner.driver {
            Some(driver) => driver.has_runner().await?,
            None => false,
        };
        if !runs {
            return Err(SessionError::invalid(
                "mode",
                "sync needs a runner to run the child; there is none (--runner, or a registered runner)",
            ));
        }
    }
    let spec = spec(
        inner,
        &parent.workspace_id,
        &req.agent_name,
        &req.title,
        &req.initial_message,
    )
    .await?;
    let budget_key = budget_key(&budget);
    let scope_key = scope.to_strings().join(":");
    let mut payload = vec![
        &parent.session_id,
        trust.as_str(),
        &req.title,
        &req.agent_name,
        &req.initial_message,
        mode.as_str_name(),
        budget_key.as_str(),
    ];
    // Unscoped creates keep the payload they had before scopes.
    if !scope.is_unscoped() {
        payload.push(&scope_key);
    }
    // So do creates with the default parent-end policy.
    if on_parent_end != ParentEnd::Terminate {
        payload.push(on_parent_end.as_str());
    }
    let idem = idempotency(
        caller,
        Action::CreateSession,
        &req.request_id,
        &payload,
        inner.request_id_retention,
    )?;
    let callback = mode == pb::ExecutionMode::Callback;
    let new = NewSession {
        write_scope: scope,
        on_parent_end,
        ..new_session(
            caller,
            &parent.workspace_id,
            &req.agent_name,
            trust,
            spec,
            callback,
            budget,
        )
    };
    let audit = allowed(
        caller,
        Action::CreateSession,
        &parent.session_id,
        format!(
            "created {}{}{}",
            new.session_id,
            scope_note(&new.write_scope),
            parent_end_note(on_parent_end)
        ),
    );
    let limits = inner.rules.limits();
    let created = inner
        .store
        .create_child(&parent.session_id, new, idem, audit, &|ctx| {
            policy::admit_spawn(ctx, &limits)
        })
        .await?;
    let fresh = matches!(created, Created::New { .. });
    let (mut session, quota) = resolve(inner, created).await?;
    if fresh && let Some(driver) = &inner.driver {
        driver.launch(session.clone());
    }
    let result = if mode == pb::ExecutionMode::Sync {
        session = wait_for_end(inner, lapse, &session.session_id).await?;
        let process = inner.store.process(&session.session_id).await?;
        let finished = inner.store.finished(&session.session_id).await?;
        Some(view::result(&session, process.as_ref(), finished.as_ref()))
    } else {
        None
    };
    Ok(pb::CreateSessionResponse {
        session: Some(created_view(inner, caller, &session).await?),
        quota: Some(view::quota(quota)),
        result,
    })
}

/// Waits until the session has ended and its exit (if it had a process)
/// is recorded; as long as the caller waits, and its token would still be
/// taken (`lapse`: a caller that ended, with its child or not, is refused
/// the result). Every commit of the ledger, the recording of an exit
/// included, wakes the store's subscribers.
async fn wait_for_end<S: Store>(
    inner: &Inner<S>,
    lapse: &Lapse,
    session_id: &SessionId,
) -> Result<crate::model::SessionRow, SessionError> {
    let mut changes = inner.store.subscribe(crate::shard::ShardSet::ALL);
    let lapsed = lapse.lapsed(inner);
    tokio::pin!(lapsed);
    loop {
        lapse.check(inner).await?;
        let row = inner
            .store
            .get_session(session_id)
            .await?
            .ok_or_else(|| SessionError::not_found(session_id))?;
        if !row.is_active() {
            let process = inner.store.process(session_id).await?;
            // A terminated session's agent is waited for until its exit is
            // recorded, unless it never started (no runner event came).
            let settled = match &process {
                Some(p) => {
                    p.exit_code.is_some()
                        || row.status != pb::SessionStatus::Terminated
                        || p.runner_seq == 0
                }
                None => true,
            };
            if settled {
                return Ok(row);
            }
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return Err(shutting_down());
                }
            }
            () = inner.shutdown.cancelled() => return Err(shutting_down()),
            refusal = &mut lapsed => return Err(refusal),
        }
    }
}

async fn resolve<S: Store>(
    inner: &Inner<S>,
    created: Created,
) -> Result<(crate::model::SessionRow, crate::error::QuotaLeft), SessionError> {
    match created {
        Created::New { session, quota } => Ok((*session, quota)),
        Created::Replayed { session_id, quota } => {
            let session = inner
                .store
                .get_session(&session_id.as_str().into())
                .await?
                .ok_or_else(|| SessionError::Internal("replayed session vanished".to_owned()))?;
            Ok((session, quota))
        }
    }
}

/// The audit note of a parent-end policy other than the default.
fn parent_end_note(policy: ParentEnd) -> String {
    match policy {
        ParentEnd::Terminate => String::new(),
        other => format!(" on_parent_end {}", other.as_str()),
    }
}

fn shutting_down() -> SessionError {
    SessionError::refused(
        Reason::Unavailable,
        "the session service is shutting down; the child goes on: GetSession tells how it ended",
    )
}
