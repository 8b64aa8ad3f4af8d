//! A session's end reaching its children, whatever ended it: who is
//! reached and how is `policy::parent_end`'s to decide; `reach_children`,
//! written once for both backends (see `backends`), applies it inside the
//! transaction that ends the session, with the events' details, the
//! `parent_ended` notice and the audit entry built here. On PostgreSQL the
//! caller holds the workspace and tree locks (`Tx::lock_session`), so no
//! spawn under the subtree and no other end in it commits meanwhile; the
//! rows it changes are locked by its updates, after those.

use serde_json::json;
use troupe_proto::{
    agent::stdin::{ParentEnded as Notice, ParentEndedType},
    session::SessionStatus,
    status::status_str,
};

use super::{backends::each_backend, journal::NewEvent};
use crate::{
    model::{
        AuditRecord, EndReason, EventDetail, NewMessage, Orphaned, ParentEnd, Principal, SessionId,
        SessionRow, Terminated,
    },
    policy::ParentEnded,
};

/// The `terminated` event of a child ended because its parent ended.
pub(crate) fn cascade_detail(by: &Principal, parent_status: SessionStatus) -> EventDetail {
    EventDetail::Terminated(Terminated {
        reason: EndReason::Cascade.to_string(),
        terminated_by: by.to_string(),
        parent_ended: Some(status_str(parent_status).to_owned()),
    })
}

/// The `orphaned` event of a child that stays active.
pub(crate) fn orphaned_detail(policy: ParentEnd, parent_status: SessionStatus) -> EventDetail {
    EventDetail::Orphaned(Orphaned {
        policy: policy.as_str().to_owned(),
        parent_status: status_str(parent_status).to_owned(),
    })
}

/// The `parent_ended` message a `notify` child (`reached`) is sent, from
/// Troupe: how its parent ended, never which session it was. `ended` is the
/// session whose end it is, as it ended.
pub(crate) fn notice(reached: &ParentEnded, ended: &SessionRow) -> NewMessage {
    // Below a child the walk terminated, the parent ended by cascade.
    let reason = if reached.parent_session_id == ended.session_id {
        ended
            .end_reason
            .as_ref()
            .map_or("manual", EndReason::notice)
    } else {
        EndReason::Cascade.notice()
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
    pub terminated: Vec<SessionId>,
    pub abandoned: Vec<SessionId>,
    pub notified: Vec<SessionId>,
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

/// What applying a session's end to its children wrote, besides their rows.
pub(crate) struct Reached {
    /// The events of the children it reached, to write after the ended
    /// session's own.
    pub events: Vec<NewEvent>,
    pub applied: Applied,
}

each_backend! {
    use troupe_proto::session::SessionStatus;

    use super::{Applied, Reached, cascade_detail, notice, orphaned_detail};
    use crate::{
        error::SessionError,
        model::{EndReason, EventKind, ParentEnd, Principal, SessionId, SessionRow},
        policy::{self, ParentEnded},
        journal::NewEvent,
    };

    impl Tx<'_> {
        /// Applies `ended`'s end (its row as it ended, in this transaction)
        /// to the active sessions below it, as `policy::parent_end` decides:
        /// children terminated (by `by`), orphaned, sent their notice, and
        /// one audit entry; their events are the caller's to write, last.
        pub(crate) async fn reach_children(
            &mut self,
            ended: &SessionRow,
            by: &Principal,
        ) -> Result<Reached, SessionError> {
            let members = self.members_below(&ended.session_id).await?;
            let plan = policy::parent_end(&ended.session_id, ended.status, &members);
            let (terminate, orphan): (Vec<_>, Vec<_>) =
                plan.iter().partition(|r| r.policy == ParentEnd::Terminate);
            let ids = |reached: &[&ParentEnded]| -> Vec<SessionId> {
                reached.iter().map(|r| r.session_id.clone()).collect()
            };
            let terminated = self
                .end_sessions(
                    &ids(&terminate),
                    SessionStatus::Terminated,
                    "",
                    &EndReason::Cascade,
                    &EndReason::Cascade,
                )
                .await?;
            let orphaned = self.orphan(&ids(&orphan)).await?;
            let mut reached = Reached { events: Vec::new(), applied: Applied::default() };
            for r in &plan {
                let id = r.session_id.as_str();
                if r.policy == ParentEnd::Terminate {
                    if !terminated.iter().any(|t| t.session_id == id) {
                        continue;
                    }
                    reached.events.push(NewEvent::new(
                        id,
                        EventKind::Terminated,
                        SessionStatus::Terminated,
                        &cascade_detail(by, r.parent_status),
                    ));
                } else {
                    let Some(row) = orphaned.iter().find(|o| o.session_id == id) else {
                        continue;
                    };
                    reached.events.push(NewEvent::new(
                        id,
                        EventKind::Orphaned,
                        row.status,
                        &orphaned_detail(r.policy, r.parent_status),
                    ));
                    if r.policy == ParentEnd::Notify {
                        let message = notice(r, ended);
                        let seq = self.insert_message(id, &message).await?;
                        reached.events.push(NewEvent::message(
                            id,
                            row.status,
                            &message.message_id,
                            seq,
                            &message.body,
                        ));
                    }
                }
                reached.applied.record(r);
            }
            if !reached.applied.is_empty() {
                This::insert_audit(self.conn(), &reached.applied.audit(&ended.session_id)).await?;
            }
            Ok(reached)
        }
    }
}
