//! The JSON view of a session, written once for every client: enums as
//! lowercase words (`running`, `sandboxed`), timestamps as RFC 3339 UTC,
//! empty strings as `null`. prost types don't derive `Serialize`, so the
//! mapping is by hand. Budgets and usage show costs in pico-dollars and as
//! decimal USD. The CLI adds `trace_id` to a session; the MCP bridge
//! adds `ended`.

use prost_types::Timestamp;
use serde_json::{Map, Value, json};

use crate::{
    money, session as pb,
    status::{parent_end_str, status_str},
    trust,
};

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
        ("budget", s.budget.as_ref().map_or(Value::Null, budget)),
        ("deadline", timestamp(s.deadline.as_ref())),
        ("usage", s.usage.as_ref().map_or(Value::Null, usage)),
        ("writable_paths", json!(s.writable_paths)),
        (
            "on_parent_end",
            Value::from(parent_end_str(s.on_parent_end())),
        ),
        ("orphaned", Value::from(s.orphaned)),
    ];
    fields
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value))
        .collect()
}

/// Returns a budget: each dimension, or `null` where it sets none; the cost
/// in pico-dollars and as decimal USD.
pub fn budget(b: &pb::Budget) -> Value {
    json!({
        "cost_pico_usd": b.cost_pico_usd,
        "cost_usd": b.cost_pico_usd.map(money::usd),
        "tokens": b.tokens,
        "model_calls": b.model_calls,
        "wall_ms": b.wall_ms,
    })
}

/// Returns a session's usage: its own calls, its subtree's, and what its
/// subtree has reserved; costs in pico-dollars and as decimal USD.
pub fn usage(u: &pb::SessionUsage) -> Value {
    let tokens = u.own_tokens.unwrap_or_default();
    json!({
        "own": {
            "calls": u.own_calls,
            "input_tokens": tokens.input,
            "output_tokens": tokens.output,
            "cache_read_tokens": tokens.cache_read,
            "cache_write_tokens": tokens.cache_write,
            "cost_pico_usd": u.own_cost_pico_usd,
            "cost_usd": money::usd(u.own_cost_pico_usd),
        },
        "subtree": {
            "calls": u.subtree_calls,
            "tokens": u.subtree_tokens,
            "cost_pico_usd": u.subtree_cost_pico_usd,
            "cost_usd": money::usd(u.subtree_cost_pico_usd),
        },
        "reserved": {
            "calls": u.reserved_calls,
            "tokens": u.reserved_tokens,
            "cost_pico_usd": u.reserved_cost_pico_usd,
        },
    })
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
        assert_eq!(session(&pb::Session::default())["budget"], Value::Null);
        assert_eq!(session(&pb::Session::default())["usage"], Value::Null);
        assert_eq!(v["on_parent_end"], "terminate");
        assert_eq!(v["orphaned"], false);
        let orphan = pb::Session {
            on_parent_end: pb::ParentEndPolicy::Notify as i32,
            orphaned: true,
            ..Default::default()
        };
        assert_eq!(session(&orphan)["on_parent_end"], "notify");
        assert_eq!(session(&orphan)["orphaned"], true);
    }

    #[test]
    fn budget_and_usage_show_usd_exactly() {
        let s = pb::Session {
            budget: Some(pb::Budget {
                cost_pico_usd: Some(2_500_000_000_000),
                tokens: None,
                model_calls: Some(10),
                wall_ms: None,
            }),
            usage: Some(pb::SessionUsage {
                own_calls: 1,
                own_cost_pico_usd: 12_207_000_000,
                subtree_cost_pico_usd: 12_207_000_000,
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = session(&s);
        assert_eq!(v["budget"]["cost_usd"], "2.50");
        assert_eq!(v["budget"]["tokens"], Value::Null);
        assert_eq!(v["budget"]["model_calls"], 10);
        assert_eq!(v["usage"]["own"]["cost_usd"], "0.012207");
        assert_eq!(v["usage"]["subtree"]["cost_pico_usd"], 12_207_000_000u64);
    }
}
