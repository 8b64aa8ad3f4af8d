//! Rows as the caller may see them: a sandboxed viewer never learns the id
//! of a direct session, even as a parent or creator.

use prost_types::Timestamp;
use troupe_proto::session::{self as pb, session_event::Detail};

use crate::{
    error::QuotaLeft,
    model::{
        Account, AuditRow, Caller, EndReason, EventDetail, EventRow, Finish, Outcome, Principal,
        ProcessRow, SessionRow, Trust, Usage,
    },
    policy::{self, trust_sees},
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
        session_id: row.session_id.to_string(),
        workspace_id: row.workspace_id.to_string(),
        parent_session_id: parent,
        tree_id: row.tree_id.to_string(),
        depth: row.depth,
        trust_level: row.trust.to_proto() as i32,
        agent_name: row.agent_name.clone(),
        title: row.title.clone(),
        status: row.status as i32,
        created_by,
        created_at: Some(timestamp(row.created_at_ms)),
        ended_at: row.ended_at_ms.map(timestamp),
        end_reason: row
            .end_reason
            .as_ref()
            .map(EndReason::to_string)
            .unwrap_or_default(),
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
    used(&Usage::of(account))
}

/// Usage (an account's, a `usage` event's), as the API gives it.
fn used(u: &Usage) -> pb::SessionUsage {
    pb::SessionUsage {
        own_calls: u.own.calls,
        own_tokens: Some(pb::TokenCounts {
            input: u.own.input_tokens,
            output: u.own.output_tokens,
            cache_read: u.own.cache_read_tokens,
            cache_write: u.own.cache_write_tokens,
        }),
        own_cost_pico_usd: u.own.cost_pico_usd,
        subtree_calls: u.subtree.calls,
        subtree_tokens: u.subtree.tokens,
        subtree_cost_pico_usd: u.subtree.cost_pico_usd,
        reserved_calls: u.reserved.calls,
        reserved_tokens: u.reserved.tokens,
        reserved_cost_pico_usd: u.reserved.cost_pico_usd,
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

/// An event's detail as `viewer` may see it.
fn detail(viewer: &Caller, detail: EventDetail) -> Option<Detail> {
    Some(match detail {
        EventDetail::Created(c) => Detail::Created(pb::Created {
            agent_name: c.agent_name,
            title: c.title,
        }),
        EventDetail::Message(m) => Detail::Message(pb::MessageQueued {
            message_id: m.message_id,
            inbox_sequence: m.inbox_sequence,
            bytes: m.bytes,
        }),
        EventDetail::Terminated(t) => Detail::Terminated(pb::Terminated {
            reason: t.reason,
            terminated_by: policy::visible_terminator(viewer, &t.terminated_by),
            parent_ended: t.parent_ended.unwrap_or_default(),
        }),
        EventDetail::Orphaned(o) => Detail::Orphaned(pb::Orphaned {
            policy: o.policy,
            parent_status: o.parent_status,
        }),
        EventDetail::Delivered(d) => Detail::Delivered(pb::Delivered {
            through_sequence: d.through_sequence,
        }),
        EventDetail::Output(o) => Detail::Output(pb::Output {
            data: o.bytes(),
            stream: o.stream,
        }),
        EventDetail::Progress(p) => Detail::Progress(pb::Progress {
            progress: p.progress,
            description: p.description,
        }),
        EventDetail::OutputTruncated(t) => Detail::OutputTruncated(pb::OutputTruncated {
            dropped_bytes: t.dropped_bytes,
            dropped_events: t.dropped_events,
            by_runner: t.by_runner,
        }),
        EventDetail::Usage(u) => Detail::Usage(used(&u)),
        EventDetail::Finished(f) => Detail::Finished(pb::Finished {
            outcome: Outcome::parse(&f.outcome).map_or(pb::Outcome::Unspecified, Outcome::to_proto)
                as i32,
            result: f.result,
        }),
        EventDetail::Ended(e) => Detail::Ended(pb::Ended {
            exit_code: e.exit_code,
            reason: e.reason,
            detail: e.detail,
        }),
        EventDetail::Nothing(_) => return None,
    })
}

/// An event as `viewer` sees it, with the watch's cursor after it.
pub fn event(viewer: &Caller, row: &EventRow, cursor: &crate::cursor::Cursor) -> pb::SessionEvent {
    let detail = EventDetail::read(row.kind, &row.detail).and_then(|d| detail(viewer, d));
    pb::SessionEvent {
        cursor: cursor.to_string(),
        sequence: row.seq as u64,
        kind: row.kind.to_proto() as i32,
        at: Some(timestamp(row.at_ms)),
        session_id: row.session_id.to_string(),
        parent_session_id: visible_parent(
            viewer,
            row.parent_session_id.as_deref(),
            row.parent_trust,
        ),
        tree_id: row.tree_id.to_string(),
        depth: row.depth,
        workspace_id: row.workspace_id.to_string(),
        trust_level: row.trust.to_proto() as i32,
        status: row.status as i32,
        detail,
    }
}
