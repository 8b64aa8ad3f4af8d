//! Every rule of the spawn tree, as pure functions over rows the store read
//! inside its transaction. Trust decisions are made here and nowhere else.
//!
//! - visibility: [`can_see`] (workspace boundary, sandboxed never sees
//!   direct), and for lists and watches [`visible_workspace`] and
//!   [`sees_only_sandboxed`], the filter the store applies; what a viewer
//!   is told of a terminator, [`visible_terminator`];
//! - trust: [`child_trust`] (inherit by default, never escalate);
//! - write scopes: [`child_scope`] (inherit by default, only narrow; a
//!   sandboxed session given none writes in the sandboxed area), [`run_scope`];
//! - quotas: [`admit_spawn`] (depth, tree, children, workspace, rate), [`admit_root`];
//! - budgets ([`admit_charge`], [`admit_budget`], [`deadline`]): a model
//!   call's reservation within every budget of its path, a child's budget
//!   that only narrows, nothing created under a spent budget;
//! - messaging, progress and termination: [`may_message`],
//!   [`may_report_progress`], [`may_finish`], [`may_reply`], [`may_terminate`];
//! - messages to many ([`reach`], [`plan_fan_out`], [`admit_group_size`])
//!   and the message rate ([`admit_messages`]);
//! - the process state machine: [`process_step`], what a runner's report
//!   (or a failure, as an exit) does to its session;
//! - a session's end and its children: [`parent_end`] (each child's
//!   parent-end policy, recursively).

mod budget;
mod messaging;
mod parent_end;

use std::time::Duration;

pub use budget::{admit_budget, admit_charge, deadline, left as budget_left};
pub use messaging::{
    admit_group_size, admit_inbox, admit_messages, plan_fan_out, reach, reach_member,
};
pub use parent_end::{Member, ParentEnded, parent_end};

use troupe_proto::{scope::SANDBOXED_AREA, session::SessionStatus, status::is_ended};

use crate::{
    agent::validate_slug,
    error::{QuotaLeft, Reason, SessionError},
    limits::Limits,
    model::{
        Account, Budget, Caller, EndReason, EventKind, ExitReason, ProcessChange, SessionId,
        SessionRow, Trust, WorkspaceId, WriteScope,
    },
};

/// Returns true if `caller` may see `target`: same workspace, and a
/// sandboxed caller sees only sandboxed sessions. Operators see everything.
pub fn can_see(caller: &Caller, target: &SessionRow) -> bool {
    match caller {
        Caller::Operator => true,
        Caller::Session(me) => {
            target.workspace_id == me.workspace_id && trust_sees(me.trust, target.trust)
        }
    }
}

/// Returns true if a viewer of trust `viewer` may see a session of trust `target` in its workspace.
pub fn trust_sees(viewer: Trust, target: Trust) -> bool {
    viewer == Trust::Direct || target == Trust::Sandboxed
}

/// Who a viewer is told terminated a session (an event's
/// `terminated_by`): a sandboxed viewer is told only `session` for a
/// session, which may be a direct ancestor it may not see.
pub fn visible_terminator(viewer: &Caller, terminated_by: &str) -> String {
    let sandboxed = matches!(viewer, Caller::Session(me) if me.trust == Trust::Sandboxed);
    if sandboxed && terminated_by.starts_with("session:") {
        "session".to_owned()
    } else {
        terminated_by.to_owned()
    }
}

/// The workspace a caller's list or watch is about: an agent's own (named
/// or not), or the one an operator named. Another workspace is answered as
/// one that does not exist.
pub fn visible_workspace(caller: &Caller, requested: &str) -> Result<WorkspaceId, SessionError> {
    match caller {
        Caller::Operator => {
            validate_slug("workspace_id", requested)?;
            Ok(requested.into())
        }
        Caller::Session(me) if requested.is_empty() || requested == me.workspace_id => {
            Ok(me.workspace_id.clone())
        }
        Caller::Session(_) => Err(SessionError::refused(
            Reason::WorkspaceNotFound,
            format!("workspace not found: {requested}"),
        )),
    }
}

/// Whether a caller sees only the sandboxed sessions of its workspace: the
/// filter that stores apply to lists and watches, so that they show what
/// [`can_see`] allows.
pub fn sees_only_sandboxed(caller: &Caller) -> bool {
    matches!(caller, Caller::Session(me) if !trust_sees(me.trust, Trust::Direct))
}

/// Decides a child's trust level: unspecified inherits the parent's; a
/// request may narrow direct to sandboxed but never raise sandboxed.
pub fn child_trust(parent: Trust, requested: Option<Trust>) -> Result<Trust, SessionError> {
    match (parent, requested) {
        (_, None) => Ok(parent),
        (Trust::Sandboxed, Some(Trust::Direct)) => Err(SessionError::refused(
            Reason::TrustEscalation,
            "a sandboxed session may create only sandboxed sessions",
        )),
        (_, Some(level)) => Ok(level),
    }
}

/// A child's write scope. Asked for: every path of it must lie inside the
/// parent's scope. Asked for none: its parent's, except that a sandboxed
/// child of a direct parent gets the sandboxed area (which must then lie
/// inside the parent's scope: a child never writes where its parent could
/// not, so a scoped direct parent names its sandboxed child's scope).
pub fn child_scope(
    parent: (Trust, &WriteScope),
    trust: Trust,
    requested: WriteScope,
) -> Result<WriteScope, SessionError> {
    let (parent_trust, parent_scope) = parent;
    let escalation = |why| SessionError::refused(Reason::ScopeEscalation, why);
    let scope = if !requested.is_unscoped() {
        parent_scope.narrows_to(&requested).map_err(escalation)?;
        requested
    } else if parent_trust == Trust::Direct && trust == Trust::Sandboxed {
        let area = WriteScope::sandboxed_area();
        parent_scope.narrows_to(&area).map_err(|why| {
            escalation(format!(
                "a sandboxed child given no write scope writes in {SANDBOXED_AREA}, but {why}: \
                 give it a scope inside the parent's"
            ))
        })?;
        area
    } else {
        parent_scope.clone()
    };
    Ok(run_scope(trust, scope))
}

/// The scope a session's agent runs under: its own, or, for a sandboxed
/// session without one (a root given none, or a row older than this rule),
/// the sandboxed area. A sandboxed agent never writes the whole workspace
/// unless the operator or a direct parent names `/workspace` itself.
pub fn run_scope(trust: Trust, scope: WriteScope) -> WriteScope {
    if trust == Trust::Sandboxed && scope.is_unscoped() {
        WriteScope::sandboxed_area()
    } else {
        scope
    }
}

/// What the store read, inside its transaction, about a spawn's parent.
#[derive(Clone, Debug)]
pub struct SpawnContext<'a> {
    pub parent: &'a SessionRow,
    /// Sessions the parent's tree holds, ended ones included.
    pub tree_sessions: u32,
    /// Of those, the sandboxed ones: all a sandboxed parent may see.
    pub tree_sandboxed: u32,
    /// Children the parent has ever created.
    pub children: u32,
    /// Sessions of the workspace that are pending or running.
    pub workspace_active: u32,
    /// The accounts of the parent's path, root first (the parent's last).
    pub accounts: &'a [Account],
    /// The child's own budget, as asked.
    pub budget: &'a Budget,
    pub now_ms: i64,
}

/// A spawn the rules allowed: where the child goes and what is left.
#[derive(Clone, Debug, PartialEq)]
pub struct Admission {
    pub depth: u32,
    /// The parent's new rate-limit state.
    pub parent_spawn_tat_ms: i64,
    pub quota: QuotaLeft,
    /// The child's deadline ([`deadline`]).
    pub deadline_ms: Option<i64>,
}

/// Applies, in order, the parent-running, depth, tree, children, workspace,
/// budget ([`admit_budget`]) and rate rules to one spawn.
pub fn admit_spawn(ctx: &SpawnContext<'_>, limits: &Limits) -> Result<Admission, SessionError> {
    let parent = ctx.parent;
    if !parent.is_active() {
        return Err(SessionError::refused(
            Reason::ParentNotRunning,
            format!(
                "parent session {} is {} and cannot create children",
                parent.session_id,
                troupe_proto::status::status_str(parent.status)
            ),
        ));
    }
    let depth = parent.depth + 1;
    // A sandboxed spawner is told the limit, never a count of sessions it
    // may not see (its tree's and its workspace's include direct ones): what
    // is left of its tree counts the sessions it may see, and the tree may
    // run out sooner.
    let counts = parent.trust == Trust::Direct;
    let tree_seen = if counts {
        ctx.tree_sessions
    } else {
        ctx.tree_sandboxed
    };
    let left_now = QuotaLeft {
        tree_sessions_remaining: limits.max_tree_sessions.saturating_sub(tree_seen),
        depth_remaining: limits.max_depth.saturating_sub(parent.depth),
        children_remaining: limits.max_children.saturating_sub(ctx.children),
    };
    let refuse = |reason, message: String| SessionError::Refused {
        reason,
        message,
        quota: Some(left_now),
        retry_after: None,
    };
    if depth > limits.max_depth {
        return Err(refuse(
            Reason::DepthExceeded,
            format!(
                "depth limit exceeded: a child would be at depth {depth}, the limit is {}",
                limits.max_depth
            ),
        ));
    }
    if ctx.tree_sessions >= limits.max_tree_sessions {
        let message = if counts {
            format!(
                "tree quota exceeded: the tree holds {} of {} sessions",
                ctx.tree_sessions, limits.max_tree_sessions
            )
        } else {
            format!(
                "tree quota exceeded: the tree holds its most sessions ({})",
                limits.max_tree_sessions
            )
        };
        return Err(refuse(Reason::TreeQuotaExceeded, message));
    }
    if ctx.children >= limits.max_children {
        return Err(refuse(
            Reason::ChildQuotaExceeded,
            format!(
                "child quota exceeded: the session has created {} of {} children",
                ctx.children, limits.max_children
            ),
        ));
    }
    if ctx.workspace_active >= limits.max_active_per_workspace {
        let message = if counts {
            format!(
                "workspace quota exceeded: {} of {} sessions are active",
                ctx.workspace_active, limits.max_active_per_workspace
            )
        } else {
            format!(
                "workspace quota exceeded: the workspace holds its most active sessions ({})",
                limits.max_active_per_workspace
            )
        };
        return Err(refuse(Reason::WorkspaceQuotaExceeded, message));
    }
    let deadline_ms = admit_budget(ctx.budget, ctx.accounts, ctx.now_ms)?;
    let parent_spawn_tat_ms = match rate_check(parent.spawn_tat_ms, ctx.now_ms, limits) {
        Ok(tat) => tat,
        Err(wait) => {
            return Err(SessionError::Refused {
                reason: Reason::RateLimited,
                message: format!(
                    "spawn rate exceeded ({} per second, burst {}): retry in {} ms",
                    limits.spawn_rate_per_sec,
                    limits.spawn_burst,
                    wait.as_millis()
                ),
                quota: Some(left_now),
                retry_after: Some(wait),
            });
        }
    };
    Ok(Admission {
        depth,
        parent_spawn_tat_ms,
        quota: QuotaLeft {
            tree_sessions_remaining: left_now.tree_sessions_remaining.saturating_sub(1),
            depth_remaining: limits.max_depth - depth,
            children_remaining: left_now.children_remaining - 1,
        },
        deadline_ms,
    })
}

/// Applies the workspace rule to a new root, and reports the new tree's quota.
pub fn admit_root(workspace_active: u32, limits: &Limits) -> Result<QuotaLeft, SessionError> {
    if workspace_active >= limits.max_active_per_workspace {
        return Err(SessionError::refused(
            Reason::WorkspaceQuotaExceeded,
            format!(
                "workspace quota exceeded: {workspace_active} of {} sessions are active",
                limits.max_active_per_workspace
            ),
        ));
    }
    Ok(QuotaLeft {
        tree_sessions_remaining: limits.max_tree_sessions.saturating_sub(1),
        depth_remaining: limits.max_depth,
        children_remaining: limits.max_children,
    })
}

/// Generic cell rate algorithm: returns the new theoretical arrival time, or
/// how long to wait. A rate of zero or less disables the limit.
fn rate_check(tat_ms: i64, now_ms: i64, limits: &Limits) -> Result<i64, Duration> {
    if limits.spawn_rate_per_sec <= 0.0 {
        return Ok(tat_ms);
    }
    let interval = (1000.0 / limits.spawn_rate_per_sec).ceil() as i64;
    let tolerance = interval * i64::from(limits.spawn_burst.max(1) - 1);
    let tat = tat_ms.max(now_ms);
    if tat - now_ms > tolerance {
        Err(Duration::from_millis((tat - tolerance - now_ms) as u64))
    } else {
        Ok(tat + interval)
    }
}

/// Checks that `caller` may message `target`. An invisible target is
/// answered exactly as a missing one.
pub fn may_message(caller: &Caller, target: &SessionRow) -> Result<(), SessionError> {
    if !can_see(caller, target) {
        return Err(SessionError::not_found(&target.session_id));
    }
    require_active(target, "it takes no messages")
}

/// Checks that a session may report progress: its own, while it is active.
pub fn may_report_progress(session: &SessionRow) -> Result<(), SessionError> {
    require_active(session, "it reports no progress")
}

/// Checks that a session may finish its task: its own, while it is active
/// (once: finishing ends it).
pub fn may_finish(session: &SessionRow) -> Result<(), SessionError> {
    require_active(
        session,
        "its task is over: it finished already, or was ended",
    )
}

/// Checks that `me` may reply to `target`: its own parent, whatever their
/// trust levels, while the parent is active. The caller names no parent:
/// the store finds it from `me`'s row, so this holds it to that.
pub fn may_reply(me: &SessionRow, target: &SessionRow) -> Result<(), SessionError> {
    if me.parent_session_id.as_deref() != Some(target.session_id.as_str()) {
        // Never its parent's id in the words: a sandboxed child may not see it.
        return Err(SessionError::invalid(
            "session",
            "a session replies to its own parent only",
        ));
    }
    if target.is_active() {
        return Ok(());
    }
    Err(SessionError::refused(
        Reason::ParentNotRunning,
        "the parent session has ended; it takes no reply",
    ))
}

/// Refuses a session that has ended, saying what it can no longer do.
fn require_active(session: &SessionRow, consequence: &str) -> Result<(), SessionError> {
    if session.is_active() {
        return Ok(());
    }
    Err(SessionError::refused(
        Reason::SessionEnded,
        format!(
            "session {} has ended ({}); {consequence}",
            session.session_id,
            troupe_proto::status::status_str(session.status)
        ),
    ))
}

/// Checks that `caller` may terminate `target`, given the target's ancestors
/// (nearest first). Agents may end only their own descendants.
pub fn may_terminate(
    caller: &Caller,
    target: &SessionRow,
    ancestors: &[SessionId],
) -> Result<(), SessionError> {
    match caller {
        Caller::Operator => Ok(()),
        Caller::Session(me) => {
            if !can_see(caller, target) {
                return Err(SessionError::not_found(&target.session_id));
            }
            if ancestors.contains(&me.session_id) {
                Ok(())
            } else {
                Err(SessionError::refused(
                    Reason::NotADescendant,
                    format!(
                        "session {} is not a descendant of the caller; agents may terminate only their own descendants",
                        target.session_id
                    ),
                ))
            }
        }
    }
}

/// What a change of its process does to a session: every store applies it
/// as it is, in the transaction that records the change.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessStep {
    /// The session's new status; `None` leaves it as it is.
    pub status: Option<SessionStatus>,
    /// Why it ended, when `status` is an end.
    pub end_reason: Option<EndReason>,
    /// The event to write, with the session's status after the step; `None`
    /// writes none (the change is recorded all the same: an exit's code).
    pub event: Option<EventKind>,
}

/// Decides what `change` does to a session that is `status`:
///
/// - `started` moves a pending session to running (a start reported again,
///   or after an end, does nothing);
/// - output and the runner's truncation are events, whatever the status;
/// - an exit ends an active session: completed on code 0 and `exited`,
///   otherwise failed, with `exit code N` or the exit's reason as the end
///   reason; an exit after an end (a termination) changes nothing.
///
/// A failure of the driver's (its process lost, no room to start it) is an
/// exit with the failure's reason ([`crate::model::Failure::exit`]), so it
/// ends only an active session, likewise.
pub fn process_step(status: SessionStatus, change: &ProcessChange) -> ProcessStep {
    let event = |kind| ProcessStep {
        event: Some(kind),
        ..ProcessStep::default()
    };
    match change {
        ProcessChange::Started if status == SessionStatus::Pending => ProcessStep {
            status: Some(SessionStatus::Running),
            end_reason: None,
            event: Some(EventKind::Started),
        },
        ProcessChange::Started => ProcessStep::default(),
        ProcessChange::Output { .. } => event(EventKind::Output),
        ProcessChange::Truncated { .. } => event(EventKind::OutputTruncated),
        ProcessChange::Exited(exit) if !is_ended(status) => {
            let (status, reason) = if exit.succeeded() {
                (SessionStatus::Completed, EndReason::Exit(exit.reason))
            } else if exit.reason == ExitReason::Exited {
                (SessionStatus::Failed, EndReason::ExitCode(exit.code))
            } else {
                (SessionStatus::Failed, EndReason::Exit(exit.reason))
            };
            ProcessStep {
                status: Some(status),
                end_reason: Some(reason),
                event: EventKind::ending(status),
            }
        }
        ProcessChange::Exited(_) => ProcessStep::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Failure, ProcessExit};

    fn exit(code: i32, reason: ExitReason) -> ProcessChange {
        ProcessChange::Exited(ProcessExit {
            code,
            reason,
            detail: String::new(),
        })
    }

    fn ends(status: SessionStatus, reason: &str) -> ProcessStep {
        ProcessStep {
            status: Some(status),
            end_reason: Some(EndReason::parse(reason)),
            event: EventKind::ending(status),
        }
    }

    fn only(kind: EventKind) -> ProcessStep {
        ProcessStep {
            event: Some(kind),
            ..ProcessStep::default()
        }
    }

    /// Every change from every status, each with what it must do (nothing,
    /// for the ones that must do nothing).
    #[test]
    fn process_steps_from_every_status() {
        use ExitReason::*;
        use SessionStatus::*;
        let output = ProcessChange::Output {
            stream: "stdout",
            data: b"hi".to_vec(),
        };
        let truncated = ProcessChange::Truncated { log_bytes: 10 };
        let lost = ProcessChange::Exited(Failure::Lost.exit("gone"));
        let no_room = ProcessChange::Exited(Failure::NoResources.exit("full"));
        let nothing = ProcessStep::default();
        let running = ProcessStep {
            status: Some(Running),
            end_reason: None,
            event: Some(EventKind::Started),
        };
        for status in [Pending, Running] {
            let start = if status == Pending {
                running.clone()
            } else {
                nothing.clone()
            };
            for (change, step) in [
                (ProcessChange::Started, start),
                (output.clone(), only(EventKind::Output)),
                (truncated.clone(), only(EventKind::OutputTruncated)),
                (exit(0, Exited), ends(Completed, "exited")),
                (exit(3, Exited), ends(Failed, "exit code 3")),
                (exit(-1, Exited), ends(Failed, "exit code -1")),
                (exit(0, Killed), ends(Failed, "killed")),
                (exit(137, Killed), ends(Failed, "killed")),
                (exit(0, TimedOut), ends(Failed, "timed_out")),
                (exit(1, ContainerLost), ends(Failed, "container_lost")),
                (exit(1, NoResources), ends(Failed, "no_resources")),
                (exit(-1, NotStarted), ends(Failed, "not_started")),
                (lost.clone(), ends(Failed, "lost")),
                (no_room.clone(), ends(Failed, "no_resources")),
            ] {
                assert_eq!(process_step(status, &change), step, "{status:?} {change:?}");
            }
        }
        for status in [Completed, Failed, Terminated] {
            for (change, step) in [
                (ProcessChange::Started, nothing.clone()),
                (output.clone(), only(EventKind::Output)),
                (truncated.clone(), only(EventKind::OutputTruncated)),
                (exit(0, Exited), nothing.clone()),
                (exit(3, Exited), nothing.clone()),
                (exit(137, Killed), nothing.clone()),
                (lost.clone(), nothing.clone()),
                (no_room.clone(), nothing.clone()),
            ] {
                assert_eq!(process_step(status, &change), step, "{status:?} {change:?}");
            }
        }
    }

    fn limits() -> Limits {
        Limits {
            spawn_rate_per_sec: 1.0,
            spawn_burst: 3,
            ..Limits::default()
        }
    }

    #[test]
    fn rate_allows_the_burst_then_asks_to_wait_one_interval() {
        let l = limits();
        let mut tat = 0;
        for _ in 0..3 {
            tat = rate_check(tat, 10_000, &l).expect("within burst");
        }
        assert_eq!(
            rate_check(tat, 10_000, &l),
            Err(Duration::from_millis(1000))
        );
        assert!(rate_check(tat, 11_000, &l).is_ok());
    }

    #[test]
    fn zero_rate_means_unlimited() {
        let l = Limits {
            spawn_rate_per_sec: 0.0,
            ..limits()
        };
        for _ in 0..100 {
            assert!(rate_check(0, 0, &l).is_ok());
        }
    }

    #[test]
    fn write_scopes_are_inherited_and_only_narrow() {
        use Trust::*;
        let scope = |p: &[&str]| WriteScope::parse(p).unwrap();
        let none = WriteScope::unscoped;
        let parent = scope(&["/workspace/src"]);
        for trust in [Direct, Sandboxed] {
            assert_eq!(
                child_scope((trust, &parent), trust, none()).ok(),
                Some(parent.clone())
            );
            let narrow = scope(&["/workspace/src/a"]);
            assert_eq!(
                child_scope((trust, &parent), trust, narrow.clone()).ok(),
                Some(narrow)
            );
            assert_eq!(
                child_scope((trust, &parent), trust, scope(&["/workspace"]))
                    .err()
                    .map(|e| e.reason()),
                Some(Reason::ScopeEscalation)
            );
        }
        assert!(
            child_scope((Direct, &none()), Direct, none())
                .unwrap()
                .is_unscoped()
        );
    }

    #[test]
    fn a_sandboxed_session_given_no_scope_writes_only_in_the_sandboxed_area() {
        use Trust::*;
        let scope = |p: &[&str]| WriteScope::parse(p).unwrap();
        let area = WriteScope::sandboxed_area();
        let none = WriteScope::unscoped;
        // A direct parent's sandboxed child, and a sandboxed child of a row
        // without a scope (older than the rule): the area, not the workspace.
        assert_eq!(
            child_scope((Direct, &none()), Sandboxed, none()).ok(),
            Some(area.clone())
        );
        assert_eq!(
            child_scope((Sandboxed, &none()), Sandboxed, none()).ok(),
            Some(area.clone())
        );
        // Even where the direct parent's own scope is inherited by direct
        // children, a sandboxed one does not share it...
        let wide = scope(&["/workspace/sandboxed", "/workspace/src"]);
        assert_eq!(
            child_scope((Direct, &wide), Sandboxed, none()).ok(),
            Some(area.clone())
        );
        // ...and where the area is outside it, the parent must name a scope.
        let src = scope(&["/workspace/src"]);
        assert_eq!(
            child_scope((Direct, &src), Sandboxed, none())
                .err()
                .map(|e| e.reason()),
            Some(Reason::ScopeEscalation)
        );
        // Named explicitly by a direct parent: what it names, the whole
        // workspace included.
        assert_eq!(
            child_scope((Direct, &none()), Sandboxed, scope(&["/workspace"])).ok(),
            Some(scope(&["/workspace"]))
        );
        assert_eq!(run_scope(Sandboxed, none()), area);
        assert!(run_scope(Direct, none()).is_unscoped());
        assert_eq!(run_scope(Sandboxed, src.clone()), src);
    }

    #[test]
    fn trust_only_narrows() {
        use Trust::*;
        assert_eq!(child_trust(Direct, None).ok(), Some(Direct));
        assert_eq!(child_trust(Direct, Some(Sandboxed)).ok(), Some(Sandboxed));
        assert_eq!(child_trust(Sandboxed, None).ok(), Some(Sandboxed));
        assert_eq!(
            child_trust(Sandboxed, Some(Direct))
                .err()
                .map(|e| e.reason()),
            Some(Reason::TrustEscalation)
        );
    }
}

#[cfg(test)]
mod reply_tests;
