//! `troupe group list|broadcast`: a workspace's groups, and the operator's
//! broadcast to every active session of a workspace.

use serde_json::{Value, json};
use troupe_proto::{
    failover,
    session::{BroadcastRequest, BroadcastScope, ListGroupsRequest, RecipientOutcome},
};

use crate::{
    Ctx,
    cli::{BroadcastArgs, GroupCommand, GroupListArgs},
    out, render, table,
};

/// Runs one `troupe group ...` command.
pub async fn run(ctx: &mut Ctx, command: &GroupCommand) -> anyhow::Result<()> {
    match command {
        GroupCommand::List(args) => list(ctx, args).await,
        GroupCommand::Broadcast(args) => broadcast(ctx, args).await,
    }
}

async fn list(ctx: &mut Ctx, args: &GroupListArgs) -> anyhow::Result<()> {
    let request = ListGroupsRequest {
        workspace_id: args.workspace.clone(),
    };
    let groups = ctx
        .call(&request, |mut c, m| async move { c.list_groups(m).await })
        .await?
        .groups;
    if ctx.json {
        let groups: Vec<Value> = groups
            .iter()
            .map(|g| {
                json!({
                    "name": g.name,
                    "workspace_id": g.workspace_id,
                    "member_ids": g.member_ids,
                    "created_at": render::time_seconds(g.created_at.as_ref()),
                })
            })
            .collect();
        return out::json(&Value::Array(groups));
    }
    let rows: Vec<Vec<String>> = groups
        .iter()
        .map(|g| {
            vec![
                g.name.clone(),
                g.member_ids.len().to_string(),
                render::time_seconds(g.created_at.as_ref()),
                g.member_ids.join(" "),
            ]
        })
        .collect();
    out::text(&table::render(
        &["NAME", "SIZE", "CREATED", "MEMBERS"],
        &rows,
    ))
}

async fn broadcast(ctx: &mut Ctx, args: &BroadcastArgs) -> anyhow::Result<()> {
    let request = BroadcastRequest {
        message: args.message.clone(),
        scope: BroadcastScope::Workspace as i32,
        request_id: args
            .request_id
            .clone()
            .unwrap_or_else(failover::fresh_request_id),
        workspace_id: args.workspace.clone(),
    };
    let recipients = ctx
        .call(&request, |mut c, m| async move { c.broadcast(m).await })
        .await?
        .recipients;
    if ctx.json {
        let recipients: Vec<Value> = recipients
            .iter()
            .map(|r| match r.outcome() {
                RecipientOutcome::Delivered => json!({
                    "session_id": r.session_id,
                    "outcome": "delivered",
                    "message_id": r.message_id,
                    "sequence": r.sequence,
                    "delivery": render::delivery_str(r.delivery()),
                }),
                RecipientOutcome::InboxFull => {
                    json!({"session_id": r.session_id, "outcome": "inbox_full"})
                }
                _ => json!({"session_id": r.session_id, "outcome": "ended"}),
            })
            .collect();
        return out::json(&json!({ "recipients": recipients }));
    }
    let mut text = String::new();
    for r in &recipients {
        match r.outcome() {
            RecipientOutcome::Delivered => text.push_str(&format!(
                "{} {} to {} (inbox #{})\n",
                r.message_id,
                render::delivery_str(r.delivery()),
                r.session_id,
                r.sequence
            )),
            RecipientOutcome::InboxFull => text.push_str(&format!(
                "{}'s inbox is full: nothing stored\n",
                r.session_id
            )),
            _ => text.push_str(&format!("{} has ended: nothing stored\n", r.session_id)),
        }
    }
    text.push_str(&format!("{} recipient(s)\n", recipients.len()));
    out::text(&text)
}
