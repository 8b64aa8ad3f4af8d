//! Rows as both stores read them for the console: a `messages` row
//! ([`crate::ConsoleStore::session_messages`]), a session's inbox
//! and progress, an audit entry.

use super::parse_stored;
use crate::{
    error::SessionError,
    model::{AuditRow, MessageRecord, Principal, ProgressReport, SessionActivity},
};

#[derive(sqlx::FromRow)]
pub(crate) struct MessageColumns {
    message_id: String,
    session_id: String,
    seq: i64,
    sender: String,
    body: String,
    created_at_ms: i64,
    delivered_at_ms: Option<i64>,
}

impl MessageColumns {
    pub(crate) fn into_record(self) -> Result<MessageRecord, SessionError> {
        Ok(MessageRecord {
            sender: parse_stored("sender", &self.sender, Principal::parse)?,
            message_id: self.message_id,
            session_id: self.session_id.into(),
            seq: u64::try_from(self.seq).unwrap_or_default(),
            body: self.body,
            created_at_ms: self.created_at_ms,
            delivered_at_ms: self.delivered_at_ms,
        })
    }
}

/// A session's inbox and last progress, as both stores read them for a
/// tree's snapshot ([`crate::ConsoleStore::workspace_activity`]):
/// `inbox_seq` of `sessions`, `delivered_seq` of its `processes` row (0
/// before it has one), `last_progress` (a progress event's detail).
#[derive(sqlx::FromRow)]
pub(crate) struct ActivityColumns {
    session_id: String,
    inbox_seq: i64,
    delivered_seq: i64,
    last_progress: Option<String>,
}

impl ActivityColumns {
    pub(crate) fn into_activity(self) -> SessionActivity {
        SessionActivity {
            session_id: self.session_id.into(),
            received: u64::try_from(self.inbox_seq).unwrap_or_default(),
            delivered_through: u64::try_from(self.delivered_seq).unwrap_or_default(),
            progress: self
                .last_progress
                .as_deref()
                .and_then(ProgressReport::from_detail),
        }
    }
}

/// An audit row as the console's reads select it.
pub(crate) type AuditColumns = (i64, i64, String, String, String, bool, String, String);

pub(crate) fn audit_row(
    (id, at_ms, caller, action, target, allowed, reason, detail): AuditColumns,
) -> AuditRow {
    AuditRow {
        id,
        at_ms,
        caller,
        action,
        target,
        allowed,
        reason,
        detail,
    }
}
