//! The JSON view of a session, written once for every client: enums as
//! lowercase words (`running`, `sandboxed`), timestamps as RFC 3339 UTC,
//! empty strings as `null`. prost types don't derive `Serialize`, so the
//! mapping is by hand. The CLI adds `trace_id` to a session; the MCP bridge
//! adds `ended`.

use prost_types::Timestamp;
use serde_json::{Map, Value, json};

use crate::{session as pb, status::status_str, trust};

/// Returns `s`, or `null` when it is empty.
pub fn text(s: &str) -> Value {
    if s.is_empty() {
        Value::Null
    } else {
        Value::String(s.to_owned())
    }
}

/// Returns a timestamp as RFC 3339 UTC, or `null` when unset.
pub fn timestamp(ts: Option<&Timestamp>) -> Value {
    ts.map_or(Value::Null, |t| Value::String(t.to_string()))
}

/// Returns the fields of a session that every client shows.
pub fn session(s: &pb::Session) -> Map<String, Value> {
    let fields = [
        ("session_id", Value::from(s.session_id.as_str())),
        ("workspace_id", Value::from(s.workspace_id.as_str())),
        ("parent_session_id", text(&s.parent_session_id)),
        ("tree_id", Value::from(s.tree_id.as_str())),
        ("depth", Value::from(s.depth)),
        ("trust_level", Value::from(trust::as_str(s.trust_level()))),
        ("agent_name", text(&s.agent_name)),
        ("title", text(&s.title)),
        ("status", Value::from(status_str(s.status()))),
        ("created_by", text(&s.created_by)),
        ("created_at", timestamp(s.created_at.as_ref())),
        ("ended_at", timestamp(s.ended_at.as_ref())),
        ("end_reason", text(&s.end_reason)),
        ("exit_code", json!(s.exit_code)),
    ];
    fields
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value))
        .collect()
}

/// Returns the spawn quota left, or `null`.
pub fn quota(q: Option<&pb::QuotaInfo>) -> Value {
    q.map_or(Value::Null, |q| {
        json!({
            "tree_sessions_remaining": q.tree_sessions_remaining,
            "depth_remaining": q.depth_remaining,
            "children_remaining": q.children_remaining,
        })
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
            created_at: Some(Timestamp {
                seconds: 1,
                nanos: 0,
            }),
            ..Default::default()
        };
        let v = session(&s);
        assert_eq!(v["session_id"], "sess_1");
        assert_eq!(v["status"], "completed");
        assert_eq!(v["trust_level"], "sandboxed");
        assert_eq!(v["exit_code"], 0);
        assert_eq!(v["created_at"], "1970-01-01T00:00:01Z");
        assert_eq!(v["parent_session_id"], Value::Null);
        assert_eq!(v["ended_at"], Value::Null);
        assert_eq!(session(&pb::Session::default())["exit_code"], Value::Null);
    }
}
