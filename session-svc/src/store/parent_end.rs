//! What both stores write alike when a session's end reaches its children
//! (`policy::parent_end` decides who and how): the events' details, the
//! `parent_ended` notice, and the audit entry. No I/O.

use serde_json::{Value, json};
use troupe_proto::{
    agent::stdin::{ParentEnded as Notice, ParentEndedType},
    session::SessionStatus,
    status::status_str,
};

use crate::{
    model::{AuditRecord, NewMessage, ParentEnd, Principal, SessionRow},
    policy::{self, ParentEnded},
};

/// The `terminated` event of a child ended because its parent ended.
pub(crate) fn cascade_detail(by: &Principal, parent_status: SessionStatus) -> Value {
    json!({"reason": "cascade", "terminated_by": by.to_string(),
           "parent_ended": status_str(parent_status)})
}

/// The `orphaned` event of a child that stays active.
pub(crate) fn orphaned_detail(policy: ParentEnd, parent_status: SessionStatus) -> Value {
    json!({"policy": policy.as_str(), "parent_status": status_str(parent_status)})
}

/// The `parent_ended` message a `notify` child (`reached`) is sent, from
/// Troupe: how its parent ended, never which session it was. `ended` is the
/// session whose end it is, as it ended.
pub(crate) fn notice(reached: &ParentEnded, ended: &SessionRow) -> NewMessage {
    // Below a child the walk terminated, the parent ended by cascade.
    let reason = if reached.parent_session_id == ended.session_id {
        policy::notice_reason(ended.end_reason.as_deref())
    } else {
        "cascade"
    };
    let parent_status = reached.parent_status;
    NewMessage {
        message_id: format!("msg_{}", uuid::Uuid::now_v7().simple()),
        sender: Principal::Troupe,
        body: Notice {
            reason: reason.to_owned(),
            status: status_str(parent_status).to_owned(),
            kind: ParentEndedType::ParentEnded,
        }
        .to_text(),
    }
}

/// What a session's end did to its children, as the store applied it.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    pub terminated: Vec<String>,
    pub abandoned: Vec<String>,
    pub notified: Vec<String>,
}

impl Applied {
    pub fn record(&mut self, reached: &ParentEnded) {
        let list = match reached.policy {
            ParentEnd::Terminate => &mut self.terminated,
            ParentEnd::Abandon => &mut self.abandoned,
            ParentEnd::Notify => &mut self.notified,
        };
        list.push(reached.session_id.clone());
    }

    pub fn is_empty(&self) -> bool {
        self.terminated.is_empty() && self.abandoned.is_empty() && self.notified.is_empty()
    }

    /// The audit entry of what `parent`'s end did, by Troupe.
    pub fn audit(&self, parent: &str) -> AuditRecord {
        AuditRecord {
            caller: Principal::Troupe,
            action: crate::model::Action::ParentEnded,
            target: parent.to_owned(),
            allowed: true,
            reason: "OK".to_owned(),
            detail: json!({"terminated": self.terminated, "abandoned": self.abandoned,
                           "notified": self.notified})
            .to_string(),
        }
    }
}
