//! The JSON the tools return, made for a model to read: enums as lowercase
//! words (`running`, `sandboxed`, `queued`), timestamps as RFC 3339 UTC,
//! absent values as `null`.

use prost_types::Timestamp;
use serde_json::{Value, json};
use troupe_proto::{
    session::{self as pb, DeliveryStatus},
    status::{is_ended, status_str},
    trust,
};

fn text(s: &str) -> Value {
    if s.is_empty() {
        Value::Null
    } else {
        Value::String(s.to_owned())
    }
}

fn timestamp(ts: Option<&Timestamp>) -> Value {
    ts.map_or(Value::Null, |t| Value::String(t.to_string()))
}

/// One session.
pub fn session(s: &pb::Session) -> Value {
    json!({
        "session_id": s.session_id,
        "title": text(&s.title),
        "agent_name": text(&s.agent_name),
        "status": status_str(s.status()),
        "ended": is_ended(s.status()),
        "exit_code": s.exit_code,
        "trust_level": trust::as_str(s.trust_level()),
        "depth": s.depth,
        "parent_session_id": text(&s.parent_session_id),
        "tree_id": s.tree_id,
        "workspace_id": s.workspace_id,
        "created_by": text(&s.created_by),
        "created_at": timestamp(s.created_at.as_ref()),
        "ended_at": timestamp(s.ended_at.as_ref()),
        "end_reason": text(&s.end_reason),
    })
}

fn opt_session(s: Option<&pb::Session>) -> Value {
    s.map_or(Value::Null, session)
}

/// Spawn quota left.
pub fn quota(q: Option<&pb::QuotaInfo>) -> Value {
    q.map_or(Value::Null, |q| {
        json!({
            "tree_sessions_remaining": q.tree_sessions_remaining,
            "depth_remaining": q.depth_remaining,
            "children_remaining": q.children_remaining,
        })
    })
}

/// How a session ended (or what it printed so far).
pub fn result(r: Option<&pb::SessionResult>) -> Value {
    r.map_or(Value::Null, |r| {
        json!({
            "status": status_str(r.status()),
            "exit_code": r.exit_code,
            "output_tail": r.output_tail,
        })
    })
}

/// A created session.
pub fn created(r: &pb::CreateSessionResponse) -> Value {
    json!({
        "session": opt_session(r.session.as_ref()),
        "quota": quota(r.quota.as_ref()),
        "result": result(r.result.as_ref()),
    })
}

/// A message sent.
pub fn sent(r: &pb::SendMessageResponse) -> Value {
    let (delivery, note) = match r.delivery() {
        DeliveryStatus::Delivered => ("delivered", "written to the recipient's running agent"),
        DeliveryStatus::Queued => (
            "queued",
            "stored in the recipient's inbox; its agent receives it when it runs",
        ),
        DeliveryStatus::Unspecified => ("unspecified", "stored in the recipient's inbox"),
    };
    json!({
        "session_id": r.session_id,
        "message_id": r.message_id,
        "sequence": r.sequence,
        "delivery": delivery,
        "note": note,
    })
}

/// The sessions the caller may see.
pub fn listed(sessions: &[pb::Session]) -> Value {
    json!({
        "count": sessions.len(),
        "sessions": sessions.iter().map(session).collect::<Vec<_>>(),
    })
}

/// One session with its children and result.
pub fn got(r: &pb::GetSessionResponse) -> Value {
    json!({
        "session": opt_session(r.session.as_ref()),
        "result": result(r.result.as_ref()),
        "children": r.children.iter().map(session).collect::<Vec<_>>(),
        "inbox_count": r.inbox_count,
    })
}

/// A termination.
pub fn terminated(r: &pb::TerminateSessionResponse) -> Value {
    json!({
        "terminated_session_ids": r.terminated_session_ids,
        "session": opt_session(r.session.as_ref()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_uses_words_and_nulls() {
        let s = pb::Session {
            session_id: "sess_1".into(),
            status: pb::SessionStatus::Completed as i32,
            trust_level: pb::TrustLevel::Sandboxed as i32,
            exit_code: Some(0),
            ..Default::default()
        };
        let v = session(&s);
        assert_eq!(v["status"], "completed");
        assert_eq!(v["ended"], true);
        assert_eq!(v["exit_code"], 0);
        assert_eq!(v["trust_level"], "sandboxed");
        assert_eq!(v["parent_session_id"], Value::Null);
        assert_eq!(result(None), Value::Null);
    }
}
