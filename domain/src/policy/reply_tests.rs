//! Who a child may reply to: its own active parent, whatever the trust
//! levels; and who a viewer is told terminated a session.

use super::*;
use crate::model::Principal;

fn row(id: &str, parent: Option<&str>, trust: Trust, status: SessionStatus) -> SessionRow {
    SessionRow {
        session_id: id.into(),
        workspace_id: "ws".into(),
        parent_session_id: parent.map(str::to_owned).map(Into::into),
        parent_trust: parent.map(|_| Trust::Direct),
        tree_id: "t".into(),
        depth: u32::from(parent.is_some()),
        trust,
        agent_name: "a".to_owned(),
        agent_command: "[]".to_owned(),
        title: id.to_owned(),
        status,
        created_by: Principal::Operator,
        created_at_ms: 0,
        ended_at_ms: None,
        end_reason: None,
        spawn_tat_ms: 0,
        inbox_seq: 0,
        trace: None,
        write_scope: Default::default(),
        on_parent_end: Default::default(),
        orphaned: false,
    }
}

/// A sandboxed child replies to its direct parent, and to no other
/// session; never to one that has ended.
#[test]
fn a_child_replies_to_its_own_active_parent_only() {
    use SessionStatus::{Completed, Running};
    let child = row("c", Some("p"), Trust::Sandboxed, Running);
    let cases = [
        (row("p", None, Trust::Direct, Running), Ok(())),
        (
            row("q", None, Trust::Direct, Running),
            Err(Reason::InvalidArgument),
        ),
        (
            row("q", None, Trust::Sandboxed, Running),
            Err(Reason::InvalidArgument),
        ),
        (
            row("p", None, Trust::Direct, Completed),
            Err(Reason::ParentNotRunning),
        ),
    ];
    for (target, expected) in cases {
        let got = may_reply(&child, &target).map_err(|e| e.reason());
        assert_eq!(
            got, expected,
            "to {} {:?}",
            target.session_id, target.status
        );
    }
}

/// A sandboxed viewer is never told which session terminated another (it
/// may be a direct ancestor); a direct viewer and the operator are, and
/// every viewer is told a terminator that is not a session.
#[test]
fn a_sandboxed_viewer_is_told_only_that_a_session_terminated() {
    use SessionStatus::Running;
    let sandboxed = Caller::Session(Box::new(row("s", Some("p"), Trust::Sandboxed, Running)));
    let direct = Caller::Session(Box::new(row("p", None, Trust::Direct, Running)));
    let by = "session:sess_direct_parent";
    assert_eq!(visible_terminator(&sandboxed, by), "session");
    assert_eq!(visible_terminator(&direct, by), by);
    assert_eq!(visible_terminator(&Caller::Operator, by), by);
    for other in ["troupe", "operator"] {
        assert_eq!(visible_terminator(&sandboxed, other), other);
    }
}
