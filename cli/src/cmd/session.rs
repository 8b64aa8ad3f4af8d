//! `troupe session create|list|get|terminate|token|send`: one call each
//! (list follows every page), printed as text or JSON; `get --raw` prints
//! the agent's latest output alone, as it is.

use anyhow::bail;
use serde_json::Value;
use troupe_proto::{
    failover,
    session::{
        Budget, CreateRootSessionRequest, CreateSessionRequest, GetSessionRequest,
        IssueSessionTokenRequest, ListWorkspaceSessionsRequest, QuotaInfo, SendMessageRequest,
        Session, TerminateSessionRequest, TrustLevel,
    },
    trust,
};

use crate::{
    Ctx,
    cli::{CreateArgs, GetArgs, ListArgs, SendArgs, TerminateArgs},
    out, render, safe, table, tree,
};

pub async fn create(ctx: &mut Ctx, args: &CreateArgs) -> anyhow::Result<()> {
    let trust_level = args.trust_level.unwrap_or(TrustLevel::Unspecified) as i32;
    let Some(parent) = &args.parent else {
        let workspace_id = args.workspace.clone().unwrap_or_default();
        let request = CreateRootSessionRequest {
            workspace_id,
            trust_level,
            title: args.title.clone(),
            agent_name: args.agent.clone(),
            initial_message: args.message.clone(),
            request_id: request_id(args.request_id.as_deref()),
            budget: budget(args)?,
            writable_paths: args.writable.clone(),
        };
        let r = ctx
            .call(&request, |mut c, m| async move {
                c.create_root_session(m).await
            })
            .await?;
        if ctx.json {
            return out::json(&render::created_root(&r));
        }
        let mut text = session_or_nothing(r.session.as_ref());
        text.push_str(&format!("{:<11} {}\n", "token", r.session_token));
        text.push_str(&format!(
            "{:<11} {}\n",
            "expires",
            render::time(r.token_expires_at.as_ref())
        ));
        text.push_str(&quota_text(r.quota.as_ref()));
        return out::text(&text);
    };
    if let Some(workspace) = &args.workspace {
        let request = GetSessionRequest {
            session_id: parent.clone(),
        };
        let parent_session = ctx
            .call(&request, |mut c, m| async move { c.get_session(m).await })
            .await?
            .session
            .unwrap_or_default();
        if &parent_session.workspace_id != workspace {
            bail!(
                "session {parent} belongs to workspace {}, not {workspace}; \
                 a child is created in its parent's workspace",
                parent_session.workspace_id
            );
        }
    }
    let request = CreateSessionRequest {
        title: args.title.clone(),
        agent_name: args.agent.clone(),
        initial_message: args.message.clone(),
        request_id: request_id(args.request_id.as_deref()),
        trust_level,
        parent_session_id: parent.clone(),
        mode: 0,
        budget: budget(args)?,
        writable_paths: args.writable.clone(),
        on_parent_end: args.on_parent_end as i32,
    };
    let r = ctx
        .call(
            &request,
            |mut c, m| async move { c.create_session(m).await },
        )
        .await?;
    if ctx.json {
        return out::json(&render::created(&r));
    }
    let mut text = session_or_nothing(r.session.as_ref());
    text.push_str(&quota_text(r.quota.as_ref()));
    out::text(&text)
}

/// The budget the flags give, if any.
fn budget(args: &CreateArgs) -> anyhow::Result<Option<Budget>> {
    let wall_ms = match args.budget_wall_secs {
        Some(secs) => Some(
            secs.checked_mul(1000)
                .ok_or_else(|| anyhow::anyhow!("--budget-wall-secs {secs} is too large"))?,
        ),
        None => None,
    };
    let budget = Budget {
        cost_pico_usd: args.budget_usd,
        tokens: args.budget_tokens,
        model_calls: args.budget_calls,
        wall_ms,
    };
    Ok((budget != Budget::default()).then_some(budget))
}

/// The request id given, else a fresh one: a create or send repeated on
/// another endpoint is then replayed, not done twice.
fn request_id(given: Option<&str>) -> String {
    given.map_or_else(failover::fresh_request_id, str::to_owned)
}

fn session_or_nothing(session: Option<&Session>) -> String {
    session.map(render::session_text).unwrap_or_default()
}

fn quota_text(quota: Option<&QuotaInfo>) -> String {
    match quota {
        None => String::new(),
        Some(q) => format!(
            "{:<11} {} more sessions in this tree, {} more levels, {} more children\n",
            "quota", q.tree_sessions_remaining, q.depth_remaining, q.children_remaining
        ),
    }
}

pub async fn list(ctx: &mut Ctx, args: &ListArgs) -> anyhow::Result<()> {
    let mut sessions = Vec::new();
    let mut page_token = String::new();
    loop {
        let request = ListWorkspaceSessionsRequest {
            workspace_id: args.workspace.clone(),
            include_ended: args.all,
            page_size: 0,
            page_token: std::mem::take(&mut page_token),
        };
        let page = ctx
            .call(&request, |mut c, m| async move {
                c.list_workspace_sessions(m).await
            })
            .await?;
        sessions.extend(page.sessions);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    if ctx.json {
        return out::json(&Value::Array(
            sessions.iter().map(render::session).collect(),
        ));
    }
    if sessions.is_empty() {
        let which = if args.all { "" } else { "active " };
        eprintln!("no {which}sessions in workspace {}", args.workspace);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = sessions
        .iter()
        .map(|s| {
            vec![
                s.session_id.clone(),
                render::status_text(s),
                trust::as_str(s.trust_level()).to_owned(),
                s.depth.to_string(),
                render::or_dash(&s.agent_name).to_owned(),
                render::or_dash(&s.parent_session_id).to_owned(),
                s.title.clone(),
            ]
        })
        .collect();
    out::text(&table::render(
        &["ID", "STATUS", "TRUST", "DEPTH", "AGENT", "PARENT", "TITLE"],
        &rows,
    ))
}

pub async fn get(ctx: &mut Ctx, args: &GetArgs) -> anyhow::Result<()> {
    if args.raw && ctx.json {
        bail!("--raw prints the agent's output as it is, not JSON: use one or the other");
    }
    let request = GetSessionRequest {
        session_id: args.id.clone(),
    };
    let r = ctx
        .call(&request, |mut c, m| async move { c.get_session(m).await })
        .await?;
    if args.raw {
        let tail = r.result.as_ref().map_or("", |x| x.output_tail.as_str());
        return out::raw(tail.as_bytes());
    }
    if ctx.json {
        return out::json(&render::got(&r));
    }
    let mut text = session_or_nothing(r.session.as_ref());
    text.push_str(&format!("{:<11} {}\n", "inbox", r.inbox_count));
    text.push_str(&format!("{:<11} {}\n", "children", r.children.len()));
    for child in &r.children {
        text.push_str(&format!("  {}\n", tree::line(child)));
    }
    if let Some(result) = &r.result {
        if let Some(code) = result.exit_code {
            text.push_str(&format!("{:<11} {code}\n", "exit code"));
        }
        if let Some(finished) = &result.finished {
            text.push_str(&format!(
                "{:<11} {}\nresult:\n",
                "outcome",
                render::outcome_str(finished.outcome())
            ));
            text.push_str(&safe::block(&finished.result));
            if !finished.result.ends_with('\n') {
                text.push('\n');
            }
        }
        if !result.output_tail.is_empty() {
            text.push_str("output (latest):\n");
            text.push_str(&safe::block(&result.output_tail));
            if !result.output_tail.ends_with('\n') {
                text.push('\n');
            }
        }
    }
    out::text(&text)
}

pub async fn terminate(ctx: &mut Ctx, args: &TerminateArgs) -> anyhow::Result<()> {
    // Repeating a termination is harmless: what had ended stays ended.
    let request = TerminateSessionRequest {
        session_id: args.id.clone(),
        reason: args.reason.clone(),
    };
    let r = ctx
        .call(
            &request,
            |mut c, m| async move { c.terminate_session(m).await },
        )
        .await?;
    if ctx.json {
        return out::json(&render::terminated(&r));
    }
    if r.terminated_session_ids.is_empty() {
        eprintln!("nothing to terminate: {} had already ended", args.id);
        return Ok(());
    }
    out::text(&r.terminated_session_ids.join("\n"))
}

pub async fn token(ctx: &mut Ctx, id: &str) -> anyhow::Result<()> {
    // A token minted on an endpoint that went away is one never used.
    let request = IssueSessionTokenRequest {
        session_id: id.to_owned(),
    };
    let r = ctx
        .call(&request, |mut c, m| async move {
            c.issue_session_token(m).await
        })
        .await?;
    if ctx.json {
        return out::json(&render::token(&r));
    }
    out::text(&r.session_token)
}

pub async fn send(ctx: &mut Ctx, args: &SendArgs) -> anyhow::Result<()> {
    let request = SendMessageRequest {
        session_id: args.id.clone(),
        message: args.message.clone(),
        request_id: request_id(args.request_id.as_deref()),
    };
    let r = ctx
        .call(&request, |mut c, m| async move { c.send_message(m).await })
        .await?;
    if ctx.json {
        return out::json(&render::sent(&r));
    }
    out::text(&format!(
        "{} {} to {} (inbox #{})",
        r.message_id,
        render::delivery_str(r.delivery()),
        r.session_id,
        r.sequence
    ))
}
