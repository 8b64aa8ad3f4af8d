//! The console's JSON: sessions, usage, events, messages and audit entries
//! as the page reads them. Every text an agent wrote is a JSON string here
//! and text on the page: none of it is ever markup.

use prost_types::Timestamp;
use serde_json::{Value, json};
use troupe_proto::{
    money::usd,
    session::{self as pb, session_event::Detail},
    status::{kind_str, parent_end_str, status_str},
    trust,
};

use super::TraceUrl;
use troupe_domain::model::{AuditRow, MessageRecord, SessionActivity};
use troupe_service::service::view;

/// Milliseconds since the Unix epoch of a protobuf timestamp.
pub fn ms(at: Option<&Timestamp>) -> Option<i64> {
    at.map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000)
}

pub fn session(s: &pb::Session, trace: Option<&TraceUrl>) -> Value {
    json!({
        "session_id": s.session_id,
        "workspace_id": s.workspace_id,
        "parent_session_id": s.parent_session_id,
        "tree_id": s.tree_id,
        "depth": s.depth,
        "trust": trust::as_str(s.trust_level()),
        "agent_name": s.agent_name,
        "title": s.title,
        "status": status_str(s.status()),
        "created_by": s.created_by,
        "created_at_ms": ms(s.created_at.as_ref()),
        "ended_at_ms": ms(s.ended_at.as_ref()),
        "end_reason": s.end_reason,
        "exit_code": s.exit_code,
        "trace_id": s.trace_id,
        "trace_url": trace.and_then(|t| t.link(&s.trace_id)),
        "writable_paths": s.writable_paths,
        "on_parent_end": parent_end_str(s.on_parent_end()),
        "orphaned": s.orphaned,
        "usage": s.usage.as_ref().map(usage),
    })
}

/// A session as a tree's snapshot gives it: with its inbox (`received`,
/// `delivered_through`, `unread`) and last progress report, which the page
/// then follows by events (`message`, `delivered`, `progress`).
pub fn tree_node(
    s: &pb::Session,
    trace: Option<&TraceUrl>,
    activity: Option<&SessionActivity>,
) -> Value {
    let mut node = session(s, trace);
    let received = activity.map_or(0, |a| a.received);
    let delivered = activity.map_or(0, |a| a.delivered_through);
    node["inbox"] = json!({
        "received": received,
        "delivered_through": delivered,
        "unread": activity.map_or(0, SessionActivity::unread),
    });
    node["progress"] = activity.and_then(|a| a.progress.as_ref()).map_or(
        Value::Null,
        |p| json!({"progress": p.progress, "description": p.description}),
    );
    node
}

/// Costs as USD text (pico-dollars overflow a JavaScript number).
pub fn usage(u: &pb::SessionUsage) -> Value {
    let own_tokens = u
        .own_tokens
        .as_ref()
        .map(|t| t.input + t.output + t.cache_read + t.cache_write)
        .unwrap_or_default();
    json!({
        "own_calls": u.own_calls,
        "own_tokens": own_tokens,
        "own_cost_usd": usd(u.own_cost_pico_usd),
        "subtree_calls": u.subtree_calls,
        "subtree_tokens": u.subtree_tokens,
        "subtree_cost_usd": usd(u.subtree_cost_pico_usd),
    })
}

pub fn event(e: &pb::SessionEvent) -> Value {
    let detail = match &e.detail {
        Some(Detail::Created(c)) => json!({"agent_name": c.agent_name, "title": c.title}),
        Some(Detail::Message(m)) => {
            json!({"message_id": m.message_id, "inbox_sequence": m.inbox_sequence, "bytes": m.bytes})
        }
        Some(Detail::Terminated(t)) => {
            json!({"reason": t.reason, "terminated_by": t.terminated_by, "parent_ended": t.parent_ended})
        }
        Some(Detail::Output(o)) => {
            json!({"stream": o.stream, "text": String::from_utf8_lossy(&o.data)})
        }
        Some(Detail::Ended(end)) => {
            json!({"exit_code": end.exit_code, "reason": end.reason, "detail": end.detail})
        }
        Some(Detail::Progress(p)) => json!({"progress": p.progress, "description": p.description}),
        Some(Detail::OutputTruncated(t)) => json!({
            "dropped_bytes": t.dropped_bytes,
            "dropped_events": t.dropped_events,
            "by_runner": t.by_runner,
        }),
        Some(Detail::Usage(u)) => usage(u),
        Some(Detail::Delivered(d)) => json!({"through_sequence": d.through_sequence}),
        Some(Detail::Orphaned(o)) => {
            json!({"policy": o.policy, "parent_status": o.parent_status})
        }
        Some(Detail::Finished(f)) => json!({
            "outcome": pb::Outcome::try_from(f.outcome)
                .map(|o| o.as_str_name().trim_start_matches("OUTCOME_").to_lowercase())
                .unwrap_or_default(),
            "result": f.result,
        }),
        None => Value::Null,
    };
    json!({
        "cursor": e.cursor,
        "kind": kind_str(e.kind()),
        "at_ms": ms(e.at.as_ref()),
        "session_id": e.session_id,
        "parent_session_id": e.parent_session_id,
        "tree_id": e.tree_id,
        "depth": e.depth,
        "workspace_id": e.workspace_id,
        "trust": trust::as_str(e.trust_level()),
        "status": status_str(e.status()),
        "detail": detail,
    })
}

pub fn message(m: &MessageRecord) -> Value {
    json!({
        "message_id": m.message_id,
        "to": m.session_id,
        "seq": m.seq,
        "from": m.sender.to_string(),
        "body": m.body,
        "created_at_ms": m.created_at_ms,
        "delivered_at_ms": m.delivered_at_ms,
    })
}

pub fn audit(a: &pb::AuditEntry) -> Value {
    json!({
        "id": a.id,
        "at_ms": ms(a.at.as_ref()),
        "caller": a.caller,
        "action": a.action,
        "target": a.target,
        "allowed": a.allowed,
        "reason": a.reason,
        "detail": a.detail,
    })
}

/// An audit entry the store read, as [`audit`] gives one the service listed.
pub fn audit_row(a: AuditRow) -> Value {
    audit(&view::audit_entry(a))
}
