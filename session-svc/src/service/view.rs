//! Rows as the caller may see them: a sandboxed viewer never learns the id
//! of a direct session, even as a parent or creator.

use prost_types::Timestamp;
use troupe_proto::session::{self as pb, EventKind, session_event::Detail};

use crate::{
    error::QuotaLeft,
    model::{
        Account, AuditRow, Caller, EventRow, Finish, Outcome, Principal, ProcessRow, SessionRow,
        Trust,
    },
    policy::trust_sees,
};

fn viewer_trust(viewer: &Caller) -> Trust {
    match viewer {
        Caller::Operator => Trust::Direct,
        Caller::Session(me) => me.trust,
    }
}

/// Returns the parent id if the viewer may see the parent.
fn visible_parent(viewer: &Caller, parent: Option<&str>, parent_trust: Option<Trust>) -> String {
    match (parent, parent_trust) {
        (Some(id), Some(trust)) if trust_sees(viewer_trust(viewer), trust) => id.to_owned(),
        _ => String::new(),
    }
}

pub fn timestamp(ms: i64) -> Timestamp {
    Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

/// An audit entry as `ListAudit` gives it.
pub fn audit_entry(row: AuditRow) -> pb::AuditEntry {
    pb::AuditEntry {
        id: row.id as u64,
        at: Some(timestamp(row.at_ms)),
        caller: row.caller,
        action: row.action,
        target: row.target,
        allowed: row.allowed,
        reason: row.reason,
        detail: row.detail,
    }
}

pub fn session(viewer: &Caller, row: &SessionRow) -> pb::Session {
    let parent = visible_parent(viewer, row.parent_session_id.as_deref(), row.parent_trust);
    let created_by = if matches!(row.created_by, Principal::Session(_))
        && row.parent_session_id.is_some()
        && parent.is_empty()
    {
        "session".to_owned()
    } else {
        row.created_by.to_string()
    };
    pb::Session {
        session_id: row.session_id.clone(),
        workspace_id: row.workspace_id.clone(),
        parent_session_id: parent,
        tree_id: row.tree_id.clone(),
        depth: row.depth,
        trust_level: row.trust.to_proto() as i32,
        agent_name: row.agent_name.clone(),
        title: row.title.clone(),
        status: row.status as i32,
        created_by,
        created_at: Some(timestamp(row.created_at_ms)),
        ended_at: row.ended_at_ms.map(timestamp),
        end_reason: row.end_reason.clone().unwrap_or_default(),
        exit_code: None,
        trace_id: row
            .trace
            .map(|life| life.trace_id.to_string())
            .unwrap_or_default(),
        budget: None,
        deadline: None,
        usage: None,
        writable_paths: row.write_scope.to_strings(),
        on_parent_end: row.on_parent_end.to_proto() as i32,
        orphaned: row.orphaned,
    }
}

/// Adds a session's budget, deadline and usage (its account) to its view.
pub fn with_account(session: &mut pb::Session, account: &Account) {
    let b = &account.budget;
    session.budget = (!b.is_empty()).then(|| pb::Budget {
        cost_pico_usd: b.cost.map(|c| c.0),
        tokens: b.tokens,
        model_calls: b.calls,
        wall_ms: b.wall_ms,
    });
    session.deadline = account.deadline_ms.map(timestamp);
    session.usage = Some(usage(account));
}

/// A session's usage, own and of its subtree.
pub fn usage(account: &Account) -> pb::SessionUsage {
    let own = &account.own;
    pb::SessionUsage {
        own_calls: own.calls,
        own_tokens: Some(pb::TokenCounts {
            input: own.tokens.input,
            output: own.tokens.output,
            cache_read: own.tokens.cache_read,
            cache_write: own.tokens.cache_write,
        }),
        own_cost_pico_usd: own.cost.0,
        subtree_calls: account.subtree.calls,
        subtree_tokens: account.subtree.tokens,
        subtree_cost_pico_usd: account.subtree.cost.0,
        reserved_calls: account.reserved.calls,
        reserved_tokens: account.reserved.tokens,
        reserved_cost_pico_usd: account.reserved.cost.0,
    }
}

/// A `usage` event's detail (as `store::accounts::usage_detail` wrote it).
fn usage_of_detail(detail: &serde_json::Value) -> pb::SessionUsage {
    let n = |part: &str, key: &str| detail[part][key].as_u64().unwrap_or_default();
    pb::SessionUsage {
        own_calls: n("own", "calls"),
        own_tokens: Some(pb::TokenCounts {
            input: n("own", "input_tokens"),
            output: n("own", "output_tokens"),
            cache_read: n("own", "cache_read_tokens"),
            cache_write: n("own", "cache_write_tokens"),
        }),
        own_cost_pico_usd: n("own", "cost_pico_usd"),
        subtree_calls: n("subtree", "calls"),
        subtree_tokens: n("subtree", "tokens"),
        subtree_cost_pico_usd: n("subtree", "cost_pico_usd"),
        reserved_calls: n("reserved", "calls"),
        reserved_tokens: n("reserved", "tokens"),
        reserved_cost_pico_usd: n("reserved", "cost_pico_usd"),
    }
}

/// How a session ended, or is doing: status, exit code, output tail, and
/// its own result if it finished its task.
pub fn result(
    row: &SessionRow,
    process: Option<&ProcessRow>,
    finished: Option<&Finish>,
) -> pb::SessionResult {
    pb::SessionResult {
        status: row.status as i32,
        exit_code: process.and_then(|p| p.exit_code),
        output_tail: process
            .map(|p| String::from_utf8_lossy(&p.output_tail).into_owned())
            .unwrap_or_default(),
        finished: finished.map(Finish::to_proto),
    }
}

pub fn quota(q: QuotaLeft) -> pb::QuotaInfo {
    pb::QuotaInfo {
        tree_sessions_remaining: q.tree_sessions_remaining,
        depth_remaining: q.depth_remaining,
        children_remaining: q.children_remaining,
    }
}

pub fn event(viewer: &Caller, row: &EventRow) -> pb::SessionEvent {
    let kind = row.kind.to_proto();
    let detail_json: serde_json::Value = serde_json::from_str(&row.detail).unwrap_or_default();
    let text = |key: &str| detail_json[key].as_str().unwrap_or_default().to_owned();
    let number = |key: &str| detail_json[key].as_u64().unwrap_or_default();
    let detail = match kind {
        EventKind::Created => Some(Detail::Created(pb::Created {
            agent_name: text("agent_name"),
            title: text("title"),
        })),
        EventKind::Message => Some(Detail::Message(pb::MessageQueued {
            message_id: text("message_id"),
            inbox_sequence: number("inbox_sequence"),
            bytes: number("bytes"),
        })),
        EventKind::Terminated => {
            let by = text("terminated_by");
            // The terminating session may be a direct ancestor the viewer may not see.
            let by = if viewer_trust(viewer) == Trust::Sandboxed && by.starts_with("session:") {
                "session".to_owned()
            } else {
                by
            };
            Some(Detail::Terminated(pb::Terminated {
                reason: text("reason"),
                terminated_by: by,
                parent_ended: text("parent_ended"),
            }))
        }
        EventKind::Orphaned => Some(Detail::Orphaned(pb::Orphaned {
            policy: text("policy"),
            parent_status: text("parent_status"),
        })),
        EventKind::Delivered => Some(Detail::Delivered(pb::Delivered {
            through_sequence: number("through_sequence"),
        })),
        EventKind::Output => Some(Detail::Output(pb::Output {
            stream: text("stream"),
            data: {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD
                    .decode(text("data"))
                    .unwrap_or_default()
            },
        })),
        EventKind::Progress => Some(Detail::Progress(pb::Progress {
            progress: number("progress") as u32,
            description: text("description"),
        })),
        EventKind::OutputTruncated => Some(Detail::OutputTruncated(pb::OutputTruncated {
            dropped_bytes: number("dropped_bytes"),
            dropped_events: number("dropped_events"),
            by_runner: detail_json["by_runner"].as_bool().unwrap_or(false),
        })),
        EventKind::Usage => Some(Detail::Usage(usage_of_detail(&detail_json))),
        EventKind::Completed | EventKind::Failed
            if detail_json["reason"].as_str() == Some(Finish::END_REASON) =>
        {
            Some(Detail::Finished(pb::Finished {
                outcome: Outcome::parse(&text("outcome"))
                    .map_or(pb::Outcome::Unspecified, Outcome::to_proto)
                    as i32,
                result: text("result"),
            }))
        }
        EventKind::Completed | EventKind::Failed if detail_json.get("reason").is_some() => {
            Some(Detail::Ended(pb::Ended {
                exit_code: detail_json["exit_code"].as_i64().unwrap_or(-1) as i32,
                reason: text("reason"),
                detail: text("detail"),
            }))
        }
        _ => None,
    };
    pb::SessionEvent {
        cursor: row.id as u64,
        sequence: row.seq as u64,
        kind: kind as i32,
        at: Some(timestamp(row.at_ms)),
        session_id: row.session_id.clone(),
        parent_session_id: visible_parent(
            viewer,
            row.parent_session_id.as_deref(),
            row.parent_trust,
        ),
        tree_id: row.tree_id.clone(),
        depth: row.depth,
        workspace_id: row.workspace_id.clone(),
        trust_level: row.trust.to_proto() as i32,
        status: row.status as i32,
        detail,
    }
}
