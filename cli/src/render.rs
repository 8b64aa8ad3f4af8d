//! Text and JSON forms of the protocol's messages. prost types don't derive
//! `Serialize`, so each message is mapped by hand, once, here: enums as
//! lowercase text, timestamps as RFC 3339 UTC, empty strings as `null`.

use crate::safe;
use prost_types::Timestamp;
use serde_json::{Map, Value, json};
use troupe_proto::{
    money,
    session::{self as pb, DeliveryStatus, session_event::Detail},
    status::{kind_str, parent_end_str, status_str},
    trust,
    view::{self, quota, text, timestamp},
};

/// Returns a timestamp as RFC 3339 UTC (`2025-01-02T03:04:05.678Z`), or `-` when unset.
pub fn time(ts: Option<&Timestamp>) -> String {
    ts.map_or_else(|| "-".to_owned(), Timestamp::to_string)
}

/// Returns a timestamp as RFC 3339 UTC to the second, for tables.
pub fn time_seconds(ts: Option<&Timestamp>) -> String {
    match ts {
        None => "-".to_owned(),
        Some(t) => Timestamp {
            seconds: t.normalized().seconds,
            nanos: 0,
        }
        .to_string(),
    }
}

/// Returns `-` for an empty string, for text output.
pub fn or_dash(text: &str) -> &str {
    if text.is_empty() { "-" } else { text }
}

pub fn delivery_str(delivery: DeliveryStatus) -> &'static str {
    match delivery {
        DeliveryStatus::Unspecified => "unspecified",
        DeliveryStatus::Queued => "queued",
        DeliveryStatus::Delivered => "delivered",
    }
}

/// Returns a session as JSON: [`view::session`] and its `trace_id`.
pub fn session(s: &pb::Session) -> Value {
    let mut fields = view::session(s);
    fields.insert("trace_id".to_owned(), text(&s.trace_id));
    Value::Object(fields)
}

/// Returns a session's status as text: `running`, or `running (orphaned)`
/// for a session whose parent ended while it stayed active.
pub fn status_text(s: &pb::Session) -> String {
    let status = status_str(s.status());
    if s.orphaned {
        format!("{status} (orphaned)")
    } else {
        status.to_owned()
    }
}

/// Returns a session as `key  value` lines, for text output; every value is
/// one terminal-safe line.
pub fn session_text(s: &pb::Session) -> String {
    let fields = [
        ("session", s.session_id.as_str()),
        ("workspace", &s.workspace_id),
        ("tree", &s.tree_id),
        ("parent", or_dash(&s.parent_session_id)),
        ("depth", &s.depth.to_string()),
        ("trust", trust::as_str(s.trust_level())),
        ("agent", or_dash(&s.agent_name)),
        ("title", or_dash(&s.title)),
        ("status", &status_text(s)),
        ("parent end", parent_end_str(s.on_parent_end())),
        ("created by", or_dash(&s.created_by)),
        ("created at", &time(s.created_at.as_ref())),
        ("ended at", &time(s.ended_at.as_ref())),
        ("end reason", or_dash(&s.end_reason)),
        ("trace", or_dash(&s.trace_id)),
    ];
    let mut text: String = fields
        .iter()
        .map(|(key, value)| format!("{key:<11} {}\n", safe::line(value)))
        .collect();
    if let Some(b) = &s.budget {
        text.push_str(&format!("{:<11} {}\n", "budget", budget_text(b)));
    }
    if s.deadline.is_some() {
        text.push_str(&format!(
            "{:<11} {}\n",
            "deadline",
            time(s.deadline.as_ref())
        ));
    }
    if let Some(u) = &s.usage {
        text.push_str(&format!("{:<11} {}\n", "usage", usage_text(u)));
    }
    if !s.writable_paths.is_empty() {
        let paths = s.writable_paths.join(", ");
        text.push_str(&format!("{:<11} {}\n", "writable", safe::line(&paths)));
    }
    text
}

/// A budget as text: each dimension it sets.
fn budget_text(b: &pb::Budget) -> String {
    let parts: Vec<String> = [
        b.cost_pico_usd.map(|c| format!("${}", money::usd(c))),
        b.tokens.map(|t| format!("{t} tokens")),
        b.model_calls.map(|c| format!("{c} calls")),
        b.wall_ms.map(|w| format!("{}s wall", w as f64 / 1000.0)),
    ]
    .into_iter()
    .flatten()
    .collect();
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(", ")
    }
}

/// Usage as text: own, then subtree.
fn usage_text(u: &pb::SessionUsage) -> String {
    let t = u.own_tokens.unwrap_or_default();
    format!(
        "own {} calls, {} tokens (in {}, out {}, cache read {}, cache write {}), ${}; \
         subtree {} calls, {} tokens, ${}",
        u.own_calls,
        t.input + t.output + t.cache_read + t.cache_write,
        t.input,
        t.output,
        t.cache_read,
        t.cache_write,
        money::usd(u.own_cost_pico_usd),
        u.subtree_calls,
        u.subtree_tokens,
        money::usd(u.subtree_cost_pico_usd),
    )
}

fn opt_session(s: Option<&pb::Session>) -> Value {
    s.map_or(Value::Null, session)
}

pub fn created_root(r: &pb::CreateRootSessionResponse) -> Value {
    json!({
        "session": opt_session(r.session.as_ref()),
        "session_token": r.session_token,
        "token_expires_at": timestamp(r.token_expires_at.as_ref()),
        "quota": quota(r.quota.as_ref()),
    })
}

pub fn created(r: &pb::CreateSessionResponse) -> Value {
    json!({
        "session": opt_session(r.session.as_ref()),
        "quota": quota(r.quota.as_ref()),
    })
}

pub fn got(r: &pb::GetSessionResponse) -> Value {
    json!({
        "session": opt_session(r.session.as_ref()),
        "children": r.children.iter().map(session).collect::<Vec<_>>(),
        "inbox_count": r.inbox_count,
        "unread_count": r.unread_count,
        "exit_code": r.result.as_ref().and_then(|x| x.exit_code),
        "output_tail": r.result.as_ref().map(|x| x.output_tail.as_str()),
        "finished": r.result.as_ref().and_then(|x| x.finished.as_ref()).map(finished),
    })
}

/// A session's own result, as it finished its task.
fn finished(f: &pb::Finished) -> Value {
    json!({
        "outcome": outcome_str(f.outcome()),
        "result": f.result,
    })
}

/// A finished session's outcome, as its JSON form spells it.
pub fn outcome_str(outcome: pb::Outcome) -> &'static str {
    match outcome {
        pb::Outcome::Success => "success",
        pb::Outcome::Failure => "failure",
        pb::Outcome::Unspecified => "unspecified",
    }
}

pub fn terminated(r: &pb::TerminateSessionResponse) -> Value {
    json!({
        "terminated_session_ids": r.terminated_session_ids,
        "session": opt_session(r.session.as_ref()),
    })
}

pub fn sent(r: &pb::SendMessageResponse) -> Value {
    json!({
        "message_id": r.message_id,
        "session_id": r.session_id,
        "sequence": r.sequence,
        "delivery": delivery_str(r.delivery()),
    })
}

pub fn token(r: &pb::IssueSessionTokenResponse) -> Value {
    json!({
        "session_token": r.session_token,
        "expires_at": timestamp(r.expires_at.as_ref()),
    })
}

pub fn event(e: &pb::SessionEvent) -> Value {
    json!({
        "cursor": e.cursor,
        "sequence": e.sequence,
        "kind": kind_str(e.kind()),
        "at": timestamp(e.at.as_ref()),
        "session_id": e.session_id,
        "parent_session_id": text(&e.parent_session_id),
        "tree_id": e.tree_id,
        "depth": e.depth,
        "workspace_id": e.workspace_id,
        "trust_level": trust::as_str(e.trust_level()),
        "status": status_str(e.status()),
        "detail": event_detail(e.detail.as_ref()),
    })
}

fn event_detail(detail: Option<&Detail>) -> Value {
    match detail {
        None => Value::Null,
        Some(Detail::Created(c)) => json!({
            "agent_name": text(&c.agent_name),
            "title": text(&c.title),
        }),
        Some(Detail::Message(m)) => json!({
            "message_id": m.message_id,
            "inbox_sequence": m.inbox_sequence,
            "bytes": m.bytes,
        }),
        Some(Detail::Terminated(t)) => json!({
            "reason": text(&t.reason),
            "terminated_by": text(&t.terminated_by),
            "parent_ended": text(&t.parent_ended),
        }),
        Some(Detail::Orphaned(o)) => json!({
            "policy": o.policy,
            "parent_status": o.parent_status,
        }),
        Some(Detail::Output(o)) => json!({
            "stream": o.stream,
            "text": String::from_utf8_lossy(&o.data),
        }),
        Some(Detail::Ended(e)) => json!({
            "exit_code": e.exit_code,
            "reason": e.reason,
            "detail": text(&e.detail),
        }),
        Some(Detail::Progress(p)) => json!({
            "progress": p.progress,
            "description": text(&p.description),
        }),
        Some(Detail::OutputTruncated(t)) => json!({
            "dropped_bytes": t.dropped_bytes,
            "dropped_events": t.dropped_events,
            "by_runner": t.by_runner,
        }),
        Some(Detail::Usage(u)) => view::usage(u),
        Some(Detail::Finished(f)) => finished(f),
        Some(Detail::Delivered(d)) => json!({"through_sequence": d.through_sequence}),
    }
}

/// Returns an event's detail as `key=value` text (empty when it has none).
pub fn event_detail_text(detail: Option<&Detail>) -> String {
    match detail {
        None => String::new(),
        Some(Detail::Created(c)) if c.title.is_empty() => format!("agent={}", c.agent_name),
        Some(Detail::Created(c)) => format!("agent={} title={}", c.agent_name, word(&c.title)),
        Some(Detail::Message(m)) => format!(
            "message={} inbox_sequence={} bytes={}",
            m.message_id, m.inbox_sequence, m.bytes
        ),
        Some(Detail::Terminated(t)) if t.parent_ended.is_empty() => {
            format!("reason={} by={}", word(&t.reason), word(&t.terminated_by))
        }
        Some(Detail::Terminated(t)) => format!(
            "reason={} by={} parent_ended={}",
            word(&t.reason),
            word(&t.terminated_by),
            word(&t.parent_ended)
        ),
        Some(Detail::Orphaned(o)) => format!(
            "policy={} parent_status={}",
            word(&o.policy),
            word(&o.parent_status)
        ),
        Some(Detail::Output(o)) => {
            format!("{}={}", o.stream, word(&String::from_utf8_lossy(&o.data)))
        }
        Some(Detail::Ended(e)) if e.detail.is_empty() => {
            format!("exit_code={} reason={}", e.exit_code, e.reason)
        }
        Some(Detail::Ended(e)) => format!(
            "exit_code={} reason={} detail={}",
            e.exit_code,
            e.reason,
            word(&e.detail)
        ),
        Some(Detail::Progress(p)) => {
            format!(
                "progress={}% description={}",
                p.progress,
                word(&p.description)
            )
        }
        Some(Detail::OutputTruncated(t)) => format!(
            "dropped_bytes={} dropped_events={}{}",
            t.dropped_bytes,
            t.dropped_events,
            if t.by_runner { " by=runner" } else { "" }
        ),
        Some(Detail::Usage(u)) => format!(
            "own_calls={} own_cost_usd={} subtree_calls={} subtree_tokens={} subtree_cost_usd={}",
            u.own_calls,
            money::usd(u.own_cost_pico_usd),
            u.subtree_calls,
            u.subtree_tokens,
            money::usd(u.subtree_cost_pico_usd)
        ),
        Some(Detail::Finished(f)) => format!(
            "reason=finished outcome={} result={}",
            outcome_str(f.outcome()),
            word(&f.result)
        ),
        Some(Detail::Delivered(d)) => format!("through_sequence={}", d.through_sequence),
    }
}

/// Returns free text as one word: quoted when it is empty or holds spaces,
/// quotes or backslashes, and terminal-safe ([`safe::line`]).
fn word(text: &str) -> String {
    let plain = !text.is_empty()
        && !text
            .chars()
            .any(|c| c.is_whitespace() || safe::is_unsafe(c) || c == '"' || c == '\\');
    if plain {
        text.to_owned()
    } else {
        safe::quoted(text)
    }
}

pub fn audit_entry(a: &pb::AuditEntry) -> Value {
    json!({
        "id": a.id,
        "at": timestamp(a.at.as_ref()),
        "caller": a.caller,
        "action": a.action,
        "target": text(&a.target),
        "allowed": a.allowed,
        "reason": text(&a.reason),
        "detail": text(&a.detail),
    })
}

/// Returns an agent definition kept in the database; `workspace_id` is
/// null for the one for every workspace.
pub fn agent(a: &pb::AgentDefinition) -> Value {
    json!({
        "workspace_id": text(&a.workspace_id),
        "name": a.name,
        "description": text(&a.description),
        "command": a.command,
        "runtime": text(&a.runtime),
        "model": text(&a.model),
        "updated_at": timestamp(a.updated_at.as_ref()),
        "updated_by": a.updated_by,
        "definition": a.definition,
    })
}

/// Returns a session with its `children`, nested: the JSON form of a tree.
pub fn tree(node: &crate::tree::Node) -> Value {
    let mut object = match session(&node.session) {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    object.insert(
        "children".to_owned(),
        Value::Array(node.children.iter().map(tree).collect()),
    );
    Value::Object(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let at = |seconds, nanos| Timestamp { seconds, nanos };
        assert_eq!(time(Some(&at(0, 0))), "1970-01-01T00:00:00Z");
        assert_eq!(
            time(Some(&at(1_735_787_045, 678_000_000))),
            "2025-01-02T03:04:05.678Z"
        );
        // 2024 is a leap year.
        assert_eq!(time(Some(&at(1_709_164_800, 0))), "2024-02-29T00:00:00Z");
        assert_eq!(time(None), "-");
        assert_eq!(
            time_seconds(Some(&at(1_735_787_045, 678_000_000))),
            "2025-01-02T03:04:05Z"
        );
    }

    #[test]
    fn session_json_uses_text_enums_and_nulls() {
        let s = pb::Session {
            session_id: "sess_1".into(),
            workspace_id: "w".into(),
            tree_id: "tree_1".into(),
            trust_level: pb::TrustLevel::Direct as i32,
            status: pb::SessionStatus::Running as i32,
            agent_name: "demo".into(),
            created_at: Some(Timestamp {
                seconds: 0,
                nanos: 0,
            }),
            ..Default::default()
        };
        let v = session(&s);
        assert_eq!(v["trust_level"], "direct");
        assert_eq!(v["status"], "running");
        assert_eq!(v["parent_session_id"], Value::Null);
        assert_eq!(v["ended_at"], Value::Null);
        assert_eq!(v["created_at"], "1970-01-01T00:00:00Z");
    }

    #[test]
    fn a_delivery_prints_its_sequence() {
        let e = pb::SessionEvent {
            kind: pb::EventKind::Delivered as i32,
            detail: Some(Detail::Delivered(pb::Delivered {
                through_sequence: 3,
            })),
            ..Default::default()
        };
        let v = event(&e);
        assert_eq!(v["kind"], "delivered");
        assert_eq!(v["detail"], json!({"through_sequence": 3}));
        assert_eq!(event_detail_text(e.detail.as_ref()), "through_sequence=3");
    }
}
