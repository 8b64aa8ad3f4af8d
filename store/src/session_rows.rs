//! A session row as both backends store it, read by one type.

use troupe_proto::status::parse_status;
use troupe_telemetry::LifeSpan;

use crate::{
    error::SessionError,
    model::{EndReason, ParentEnd, Principal, SessionRow, Trust},
    {parse_scope, parse_stored},
};

/// A session row as both backends store it (SQLite's `rowid` read as
/// `row_id`).
#[derive(sqlx::FromRow)]
pub(crate) struct RawSession {
    pub(crate) row_id: i64,
    session_id: String,
    workspace_id: String,
    parent_session_id: Option<String>,
    parent_trust_level: Option<String>,
    tree_id: String,
    depth: i32,
    trust_level: String,
    agent_name: String,
    agent_command: String,
    title: String,
    status: String,
    created_by: String,
    created_at_ms: i64,
    ended_at_ms: Option<i64>,
    end_reason: Option<String>,
    spawn_tat_ms: i64,
    inbox_seq: i64,
    traceparent: Option<String>,
    spawn_span_id: Option<String>,
    writable_paths: String,
    on_parent_end: String,
    orphaned: bool,
    /// PostgreSQL's count of the session's children, which its spawn rule
    /// reads; SQLite's ledger counts them instead, and it selects 0.
    pub(crate) children: i32,
}

impl RawSession {
    pub(crate) fn into_row(self) -> Result<SessionRow, SessionError> {
        Ok(SessionRow {
            trust: parse_stored("trust level", &self.trust_level, Trust::from_db)?,
            status: parse_stored("status", &self.status, parse_status)?,
            parent_trust: self
                .parent_trust_level
                .as_deref()
                .map(|t| parse_stored("trust level", t, Trust::from_db))
                .transpose()?,
            created_by: parse_stored("creator", &self.created_by, Principal::parse)?,
            session_id: self.session_id.into(),
            workspace_id: self.workspace_id.into(),
            parent_session_id: self.parent_session_id.map(Into::into),
            tree_id: self.tree_id.into(),
            depth: self.depth as u32,
            agent_name: self.agent_name,
            agent_command: self.agent_command,
            title: self.title,
            created_at_ms: self.created_at_ms,
            ended_at_ms: self.ended_at_ms,
            end_reason: self.end_reason.as_deref().map(EndReason::parse),
            spawn_tat_ms: self.spawn_tat_ms,
            inbox_seq: self.inbox_seq,
            trace: match (&self.traceparent, &self.spawn_span_id) {
                (Some(traceparent), Some(spawn)) => LifeSpan::parse(traceparent, spawn),
                _ => None,
            },
            write_scope: parse_stored("write scope", &self.writable_paths, parse_scope)?,
            on_parent_end: parse_stored(
                "parent-end policy",
                &self.on_parent_end,
                ParentEnd::parse,
            )?,
            orphaned: self.orphaned,
        })
    }
}
