//! What a session's end does to its children (their parent-end policies):
//! the one rule every store applies, in the transaction that ends the
//! session, whatever ended it (an exit, a failure, a lost runner, a finish,
//! a termination).
//!
//! Each active child applies its own policy: `terminate` ends it (end
//! reason `cascade`) and its own active children apply theirs in turn;
//! `abandon` leaves it running, orphaned, with its whole subtree (which
//! still has its parent, the orphan); `notify` is `abandon` and a
//! `parent_ended` message in its inbox. A child that had ended already is
//! passed over: its own end applied its children's policies then.
//!
//! Budgets are not a parent's end: a wall-clock budget that runs out ends
//! every session under it (each of them is past its own deadline, which is
//! never later than an ancestor's), orphans included; cost, token and call
//! budgets and the quotas count orphans as before, through the parent
//! links, which never change.

use troupe_proto::session::SessionStatus;

use crate::model::{ParentEnd, SessionId, SessionRow};

/// An active session below the one that ends, as the walk needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub session_id: SessionId,
    pub parent_session_id: Option<SessionId>,
    pub on_parent_end: ParentEnd,
}

impl Member {
    pub fn of(row: &SessionRow) -> Member {
        Member {
            session_id: row.session_id.clone(),
            parent_session_id: row.parent_session_id.clone(),
            on_parent_end: row.on_parent_end,
        }
    }
}

/// What happens to one session because its parent ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParentEnded {
    pub session_id: SessionId,
    /// Its parent: the ended session, or a child the walk terminated.
    pub parent_session_id: SessionId,
    /// Its own policy: what happens to it.
    pub policy: ParentEnd,
    /// How its parent ended: the ended session's status for its children,
    /// `Terminated` below a child that the walk terminated.
    pub parent_status: SessionStatus,
}

/// The sessions a session's end reaches, level by level (each level in
/// the order of `active`), from `active`, the active sessions below it (any
/// of its descendants, in creation order; itself and sessions outside its
/// subtree are ignored). `status` is how it ended.
pub fn parent_end(ended: &SessionId, status: SessionStatus, active: &[Member]) -> Vec<ParentEnded> {
    let mut out = Vec::new();
    let mut level = vec![(ended.clone(), status)];
    while !level.is_empty() {
        let mut next = Vec::new();
        for (parent, parent_status) in &level {
            for child in active
                .iter()
                .filter(|m| m.parent_session_id.as_ref() == Some(parent))
                .filter(|m| m.session_id != *ended)
            {
                if child.on_parent_end == ParentEnd::Terminate {
                    next.push((child.session_id.clone(), SessionStatus::Terminated));
                }
                out.push(ParentEnded {
                    session_id: child.session_id.clone(),
                    parent_session_id: parent.clone(),
                    policy: child.on_parent_end,
                    parent_status: *parent_status,
                });
            }
        }
        level = next;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use SessionStatus::{Completed, Failed, Terminated};

    fn m(id: &str, parent: &str, policy: ParentEnd) -> Member {
        Member {
            session_id: id.into(),
            parent_session_id: Some(parent.into()),
            on_parent_end: policy,
        }
    }

    fn reached(plan: &[ParentEnded]) -> Vec<(&str, ParentEnd, SessionStatus)> {
        plan.iter()
            .map(|p| (p.session_id.as_str(), p.policy, p.parent_status))
            .collect()
    }

    #[test]
    fn terminate_goes_down_abandon_and_notify_stop_the_walk() {
        use ParentEnd::{Abandon, Notify, Terminate};
        let active = [
            m("p", "root", Terminate),
            m("t", "p", Terminate),
            m("a", "p", Abandon),
            m("n", "p", Notify),
            m("tt", "t", Terminate),
            m("ta", "t", Abandon),
            m("at", "a", Terminate),
            m("nt", "n", Terminate),
            m("tta", "tt", Notify),
        ];
        let plan = parent_end(&"p".into(), Failed, &active);
        assert_eq!(
            reached(&plan),
            vec![
                ("t", Terminate, Failed),
                ("a", Abandon, Failed),
                ("n", Notify, Failed),
                ("tt", Terminate, Terminated),
                ("ta", Abandon, Terminated),
                ("tta", Notify, Terminated),
            ]
        );
    }

    #[test]
    fn a_child_that_ended_already_is_passed_over_with_its_subtree() {
        use ParentEnd::Terminate;
        // "gone" ended before: it is not among the active, and its child
        // (an orphan of an earlier end) is not reached through it.
        let active = [m("x", "gone", Terminate), m("y", "p", Terminate)];
        let plan = parent_end(&"p".into(), Completed, &active);
        assert_eq!(reached(&plan), vec![("y", Terminate, Completed)]);
        assert!(parent_end(&"leaf".into(), Completed, &active).is_empty());
    }
}
