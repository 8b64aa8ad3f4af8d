//! `Broadcast`, `CreateGroup`, `AddGroupMembers`, `PostToGroup`,
//! `ListGroups`: one message to many, and the named groups it may go to.
//! Who gets a message is `policy::plan_fan_out`'s to decide (SendMessage's
//! rule for every recipient), inside the store's transaction; each
//! recipient's message is then delivered as SendMessage's is.
//!
//! A recipient is whoever the sender may message: a sandboxed child does not
//! reach its direct parent by broadcast (`ReplyToParent` is its way up), and
//! a direct member's post reaches a sandboxed member as a direct session's
//! message does (its sender unnamed on stdin).

use troupe_proto::session as pb;

use super::{Inner, MAX_MESSAGE_BYTES, allowed, check_len, idempotency, message::bounds, view};
use crate::{
    error::{Reason, SessionError},
    model::{
        Action, Audience, Caller, FannedOut, GroupName, GroupRow, Idempotency, MessageRate,
        Reached, Sending, SessionId, SessionRow,
    },
    policy,
    store::{FanOut, Store},
};

pub async fn broadcast<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::BroadcastRequest,
) -> Result<pb::BroadcastResponse, SessionError> {
    let scope = pb::BroadcastScope::try_from(req.scope)
        .map_err(|_| SessionError::invalid("scope", format!("unknown scope {}", req.scope)))?;
    let audience = match (caller, scope) {
        (Caller::Operator, pb::BroadcastScope::Unspecified | pb::BroadcastScope::Workspace) => {
            Audience::Workspace(policy::visible_workspace(caller, &req.workspace_id)?)
        }
        (Caller::Operator, _) => {
            return Err(SessionError::invalid(
                "scope",
                "the operator has no subtree: it broadcasts to a workspace (workspace_id)",
            ));
        }
        (Caller::Session(_), pb::BroadcastScope::Unspecified | pb::BroadcastScope::Workspace) => {
            Audience::Workspace(policy::visible_workspace(caller, &req.workspace_id)?)
        }
        (Caller::Session(me), pb::BroadcastScope::Subtree) => {
            Audience::Subtree(me.session_id.clone())
        }
        (Caller::Session(me), pb::BroadcastScope::Children) => {
            Audience::Children(me.session_id.clone())
        }
    };
    let idem = message_checks(
        caller,
        Action::Broadcast,
        &req.message,
        &req.request_id,
        inner,
        &[&req.scope.to_string(), &req.workspace_id],
    )?;
    let target = match &audience {
        Audience::Workspace(ws) => ws.to_string(),
        Audience::Subtree(id) | Audience::Children(id) => id.to_string(),
        Audience::Group { .. } => String::new(),
    };
    let recipients = fan_out(
        inner,
        caller,
        Action::Broadcast,
        &target,
        audience,
        &req.message,
        idem,
    )
    .await?;
    Ok(pb::BroadcastResponse { recipients })
}

pub async fn post<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::PostToGroupRequest,
) -> Result<pb::PostToGroupResponse, SessionError> {
    let me = session_only(caller)?;
    let name = GroupName::parse("group", &req.group)?;
    let idem = message_checks(
        caller,
        Action::PostToGroup,
        &req.message,
        &req.request_id,
        inner,
        &[&req.group],
    )?;
    let audience = Audience::Group {
        workspace_id: me.workspace_id.clone(),
        name,
        poster: me.session_id.clone(),
    };
    let recipients = fan_out(
        inner,
        caller,
        Action::PostToGroup,
        &req.group,
        audience,
        &req.message,
        idem,
    )
    .await?;
    Ok(pb::PostToGroupResponse { recipients })
}

pub async fn create<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::CreateGroupRequest,
) -> Result<pb::CreateGroupResponse, SessionError> {
    let me = session_only(caller)?;
    let name = GroupName::parse("name", &req.name)?;
    let audit = allowed(caller, Action::CreateGroup, &req.name, String::new());
    let group = inner
        .store
        .create_group(&me.workspace_id, &name, &me.session_id, audit)
        .await?;
    Ok(pb::CreateGroupResponse {
        group: Some(group_view(caller, &group)),
    })
}

pub async fn add<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::AddGroupMembersRequest,
) -> Result<pb::AddGroupMembersResponse, SessionError> {
    let me = session_only(caller)?;
    let name = GroupName::parse("group", &req.group)?;
    if req.session_ids.is_empty() {
        return Err(SessionError::invalid(
            "session_ids",
            "name at least one session",
        ));
    }
    let max_fan_out = inner.rules.messaging().max_fan_out;
    if req.session_ids.len() > max_fan_out as usize {
        return Err(SessionError::invalid(
            "session_ids",
            format!("at most {max_fan_out} at once"),
        ));
    }
    for id in &req.session_ids {
        check_len("session_ids", id, super::MAX_SHORT_TEXT)?;
    }
    let audit = allowed(
        caller,
        Action::AddGroupMembers,
        &req.group,
        serde_json::json!({ "added": req.session_ids }).to_string(),
    );
    let limits = inner.rules.messaging();
    let check = |rows: &[SessionRow], after: &[SessionRow]| {
        for row in rows {
            policy::may_message(caller, row)?;
        }
        policy::admit_group_size(caller, after, &limits)
    };
    let group = inner
        .store
        .add_group_members(
            &me.workspace_id,
            &name,
            &me.session_id,
            &req.session_ids
                .iter()
                .map(SessionId::from)
                .collect::<Vec<_>>(),
            audit,
            &check,
        )
        .await?;
    Ok(pb::AddGroupMembersResponse {
        group: Some(group_view(caller, &group)),
    })
}

pub async fn list<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::ListGroupsRequest,
) -> Result<pb::ListGroupsResponse, SessionError> {
    let workspace_id = policy::visible_workspace(caller, &req.workspace_id)?;
    let member = match caller {
        Caller::Session(me) => Some(&me.session_id),
        Caller::Operator => None,
    };
    let groups = inner.store.groups(&workspace_id, member).await?;
    Ok(pb::ListGroupsResponse {
        groups: groups.iter().map(|g| group_view(caller, g)).collect(),
    })
}

/// A group as `viewer` may see it: only the members it may see.
fn group_view(viewer: &Caller, group: &GroupRow) -> pb::Group {
    pb::Group {
        name: group.name.as_str().to_owned(),
        workspace_id: group.workspace_id.to_string(),
        member_ids: group
            .members
            .iter()
            .filter(|m| policy::can_see(viewer, m))
            .map(|m| m.session_id.to_string())
            .collect(),
        created_at: Some(view::timestamp(group.created_at_ms)),
    }
}

fn session_only(caller: &Caller) -> Result<&SessionRow, SessionError> {
    match caller {
        Caller::Session(me) => Ok(me),
        Caller::Operator => Err(SessionError::refused(
            Reason::SessionOnly,
            "groups are sessions': call with a session's token",
        )),
    }
}

/// The message's own checks, and the call's request id.
fn message_checks<S>(
    caller: &Caller,
    action: crate::model::Action,
    message: &str,
    request_id: &str,
    inner: &Inner<S>,
    payload: &[&str],
) -> Result<Option<Idempotency>, SessionError> {
    if message.is_empty() {
        return Err(SessionError::invalid("message", "must not be empty"));
    }
    check_len("message", message, MAX_MESSAGE_BYTES)?;
    let mut parts = vec![message];
    parts.extend_from_slice(payload);
    idempotency(
        caller,
        action,
        request_id,
        &parts,
        inner.request_id_retention,
    )
}

/// Stores the message for every recipient `plan_fan_out` allows, in one
/// transaction, then delivers each at once where this replica owns its
/// runner. Returns each recipient the caller may see, once.
async fn fan_out<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    action: crate::model::Action,
    target: &str,
    audience: Audience,
    body: &str,
    idem: Option<Idempotency>,
) -> Result<Vec<pb::Recipient>, SessionError> {
    let out = FanOut {
        audience,
        sender: caller.principal(),
        body: body.to_owned(),
    };
    let limits = inner.rules.messaging();
    let reach = match out.audience {
        Audience::Group { .. } => policy::reach_member,
        _ => policy::reach,
    };
    let plan = |rows: &[SessionRow]| policy::plan_fan_out(caller, rows, &limits, reach);
    let rate = |rate: MessageRate, sending: Sending| {
        policy::admit_messages(rate, sending, crate::model::now_ms(), &limits)
    };
    let inbox = |unread: u64, bytes: u64| policy::admit_inbox(unread, bytes, &limits);
    let audit = allowed(caller, action, target, String::new());
    let FannedOut { reached, .. } = inner
        .store
        .fan_out(&out, idem, audit, bounds(caller, &rate, &inbox), &plan)
        .await?;
    let mut recipients = Vec::with_capacity(reached.len());
    for r in reached {
        recipients.push(match r {
            Reached::Delivered {
                session_id,
                message_id,
                sequence,
            } => {
                let delivered = match &inner.driver {
                    Some(driver) => driver.deliver(&session_id).await,
                    None => false,
                };
                if !delivered {
                    crate::metrics::queued();
                }
                pb::Recipient {
                    session_id: session_id.into(),
                    outcome: pb::RecipientOutcome::Delivered as i32,
                    message_id,
                    sequence,
                    delivery: if delivered {
                        pb::DeliveryStatus::Delivered
                    } else {
                        pb::DeliveryStatus::Queued
                    } as i32,
                }
            }
            Reached::Ended { session_id } => pb::Recipient {
                session_id: session_id.into(),
                outcome: pb::RecipientOutcome::Ended as i32,
                ..Default::default()
            },
            Reached::InboxFull { session_id } => pb::Recipient {
                session_id: session_id.into(),
                outcome: pb::RecipientOutcome::InboxFull as i32,
                ..Default::default()
            },
        });
    }
    Ok(recipients)
}
