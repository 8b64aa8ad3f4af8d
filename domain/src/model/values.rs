//! The domain's small values with a stored text form: event kinds, exit
//! reasons, principals (`operator`, `session:<id>`, `troupe`,
//! `anonymous`). Each is parsed once, where the store reads it; an
//! unknown stored text is a storage error, never a panic.

use std::fmt;

use super::SessionId;

use troupe_proto::{
    session::{self as pb, SessionStatus},
    status::{kind_str, parse_kind},
};

/// What an event says happened to a session. Its text is the proto's
/// (`troupe_proto::status::kind_str`), as stored and as the CLI prints it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Created,
    Started,
    Message,
    Output,
    OutputTruncated,
    Progress,
    /// A model call settled: the session's usage after it.
    Usage,
    Completed,
    Failed,
    Terminated,
    /// Its parent ended and it stays active (policy `abandon` or `notify`).
    Orphaned,
    /// Its inbox's messages up to a sequence were handed to its agent.
    Delivered,
}

impl EventKind {
    pub const ALL: [EventKind; 12] = [
        EventKind::Created,
        EventKind::Started,
        EventKind::Message,
        EventKind::Output,
        EventKind::OutputTruncated,
        EventKind::Progress,
        EventKind::Usage,
        EventKind::Completed,
        EventKind::Failed,
        EventKind::Terminated,
        EventKind::Orphaned,
        EventKind::Delivered,
    ];

    pub fn to_proto(self) -> pb::EventKind {
        match self {
            EventKind::Created => pb::EventKind::Created,
            EventKind::Started => pb::EventKind::Started,
            EventKind::Message => pb::EventKind::Message,
            EventKind::Output => pb::EventKind::Output,
            EventKind::OutputTruncated => pb::EventKind::OutputTruncated,
            EventKind::Progress => pb::EventKind::Progress,
            EventKind::Usage => pb::EventKind::Usage,
            EventKind::Completed => pb::EventKind::Completed,
            EventKind::Failed => pb::EventKind::Failed,
            EventKind::Terminated => pb::EventKind::Terminated,
            EventKind::Orphaned => pb::EventKind::Orphaned,
            EventKind::Delivered => pb::EventKind::Delivered,
        }
    }

    /// The stored form (`created`, `output_truncated`, ...).
    pub fn as_str(self) -> &'static str {
        kind_str(self.to_proto())
    }

    /// Parses the stored form.
    pub fn parse(text: &str) -> Option<EventKind> {
        let kind = parse_kind(text)?;
        EventKind::ALL.into_iter().find(|k| k.to_proto() == kind)
    }

    /// The event that ends a session with `status`, if `status` is an end.
    pub fn ending(status: SessionStatus) -> Option<EventKind> {
        match status {
            SessionStatus::Completed => Some(EventKind::Completed),
            SessionStatus::Failed => Some(EventKind::Failed),
            SessionStatus::Terminated => Some(EventKind::Terminated),
            SessionStatus::Unspecified | SessionStatus::Pending | SessionStatus::Running => None,
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an agent's process ended: the runner's reasons, and the driver's
/// own for a process it lost or never started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitReason {
    /// It exited by itself (with its code).
    Exited,
    /// It was stopped (a termination).
    Killed,
    /// It ran past its deadline.
    TimedOut,
    /// Its workspace container went away.
    ContainerLost,
    /// The runner had no room for it.
    NoResources,
    /// Its process vanished, or could not be started (the driver's).
    Lost,
    /// Its session ended before it started (the driver's).
    NotStarted,
    /// Its runner stopped renewing its registration (the driver's).
    RunnerLost,
    /// Its wall-clock budget (its own or an ancestor's) ran out: the
    /// owner of the background work ended its subtree.
    Budget,
}

impl ExitReason {
    pub const ALL: [ExitReason; 9] = [
        ExitReason::Exited,
        ExitReason::Killed,
        ExitReason::TimedOut,
        ExitReason::ContainerLost,
        ExitReason::NoResources,
        ExitReason::Lost,
        ExitReason::NotStarted,
        ExitReason::RunnerLost,
        ExitReason::Budget,
    ];

    /// The stored form, also the session's end reason and the event's.
    pub fn as_str(self) -> &'static str {
        match self {
            ExitReason::Exited => "exited",
            ExitReason::Killed => "killed",
            ExitReason::TimedOut => "timed_out",
            ExitReason::ContainerLost => "container_lost",
            ExitReason::NoResources => "no_resources",
            ExitReason::Lost => "lost",
            ExitReason::NotStarted => "not_started",
            ExitReason::RunnerLost => "runner_lost",
            ExitReason::Budget => "budget",
        }
    }

    /// Parses the stored form.
    pub fn parse(text: &str) -> Option<ExitReason> {
        ExitReason::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

impl fmt::Display for ExitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a session ended, as `sessions.end_reason` stores it: the text of
/// [`EndReason`]'s `Display`, read back by [`EndReason::parse`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// It finished its own task (`FinishSession`).
    Finished,
    /// An ancestor's end reached it: its parent-end policy, or an ended
    /// session's active subtree terminated whole.
    Cascade,
    /// Its process ended (or the driver ended it) for this reason.
    Exit(ExitReason),
    /// Its process exited by itself with this code, not 0.
    ExitCode(i32),
    /// A termination, with the reason its terminator gave (free text).
    Given(String),
}

impl EndReason {
    const CASCADE: &'static str = "cascade";
    const EXIT_CODE: &'static str = "exit code ";

    /// Reads a stored end reason. Free text that reads as one of Troupe's
    /// own (`cascade`, an exit reason) is that one.
    pub fn parse(text: &str) -> EndReason {
        if text == super::Finish::END_REASON {
            return EndReason::Finished;
        }
        if text == Self::CASCADE {
            return EndReason::Cascade;
        }
        if let Some(reason) = ExitReason::parse(text) {
            return EndReason::Exit(reason);
        }
        match text.strip_prefix(Self::EXIT_CODE).map(str::parse) {
            Some(Ok(code)) => EndReason::ExitCode(code),
            _ => EndReason::Given(text.to_owned()),
        }
    }

    /// The reason a `parent_ended` notice gives for it: Troupe's own words
    /// (`finished`, `cascade`, an exit reason; a failing code is `exited`),
    /// and `manual` for a termination: the text a terminating caller gave
    /// is never passed on.
    pub fn notice(&self) -> &'static str {
        match self {
            EndReason::Finished => super::Finish::END_REASON,
            EndReason::Cascade => Self::CASCADE,
            EndReason::Exit(reason) => reason.as_str(),
            EndReason::ExitCode(_) => ExitReason::Exited.as_str(),
            EndReason::Given(_) => "manual",
        }
    }
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndReason::Finished => f.write_str(super::Finish::END_REASON),
            EndReason::Cascade => f.write_str(Self::CASCADE),
            EndReason::Exit(reason) => f.write_str(reason.as_str()),
            EndReason::ExitCode(code) => write!(f, "{}{code}", Self::EXIT_CODE),
            EndReason::Given(text) => f.write_str(text),
        }
    }
}

/// What happens to a session when its parent ends, however it ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ParentEnd {
    /// It is terminated with its parent (end reason `cascade`).
    #[default]
    Terminate,
    /// It keeps running, orphaned, its subtree with it.
    Abandon,
    /// As `Abandon`, and it is sent a `parent_ended` message.
    Notify,
}

impl ParentEnd {
    pub const ALL: [ParentEnd; 3] = [ParentEnd::Terminate, ParentEnd::Abandon, ParentEnd::Notify];

    /// Maps the wire enum; unspecified is the default, `Terminate`.
    pub fn from_proto(policy: pb::ParentEndPolicy) -> ParentEnd {
        match policy {
            pb::ParentEndPolicy::Unspecified | pb::ParentEndPolicy::Terminate => {
                ParentEnd::Terminate
            }
            pb::ParentEndPolicy::Abandon => ParentEnd::Abandon,
            pb::ParentEndPolicy::Notify => ParentEnd::Notify,
        }
    }

    pub fn to_proto(self) -> pb::ParentEndPolicy {
        match self {
            ParentEnd::Terminate => pb::ParentEndPolicy::Terminate,
            ParentEnd::Abandon => pb::ParentEndPolicy::Abandon,
            ParentEnd::Notify => pb::ParentEndPolicy::Notify,
        }
    }

    /// The stored form (`terminate`, `abandon`, `notify`).
    pub fn as_str(self) -> &'static str {
        troupe_proto::status::parent_end_str(self.to_proto())
    }

    /// Parses the stored form.
    pub fn parse(text: &str) -> Option<ParentEnd> {
        troupe_proto::status::parse_parent_end(text).map(ParentEnd::from_proto)
    }
}

/// Who did something: created a session, sent a message, terminated, made
/// a call the audit log records. Stored as `operator`, `session:<id>`,
/// `troupe` or `anonymous`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Principal {
    /// The holder of the operator token.
    Operator,
    /// An agent, as this session.
    Session(SessionId),
    /// The session service itself: its callback notices and the driver's
    /// audit entries (`troupe`, as agents read it: `TROUPE_SENDER`).
    Troupe,
    /// A caller whose token did not identify it: only in the audit of its
    /// refusal.
    Anonymous,
}

impl Principal {
    /// Parses the stored form.
    pub fn parse(text: &str) -> Option<Principal> {
        match text {
            "operator" => Some(Principal::Operator),
            "anonymous" => Some(Principal::Anonymous),
            troupe_proto::agent::stdin::TROUPE_SENDER => Some(Principal::Troupe),
            _ => match text.strip_prefix("session:") {
                Some(id) if !id.is_empty() => Some(Principal::Session(id.into())),
                _ => None,
            },
        }
    }

    /// The session this principal is, if it is one.
    pub fn session_id(&self) -> Option<&SessionId> {
        match self {
            Principal::Session(id) => Some(id),
            _ => None,
        }
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Principal::Operator => f.write_str("operator"),
            Principal::Session(id) => write!(f, "session:{id}"),
            Principal::Troupe => f.write_str(troupe_proto::agent::stdin::TROUPE_SENDER),
            Principal::Anonymous => f.write_str("anonymous"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every end reason reads back as it is stored; free text stays text.
    #[test]
    fn end_reasons_read_back_as_stored() {
        let reasons = [
            (EndReason::Finished, "finished"),
            (EndReason::Cascade, "cascade"),
            (EndReason::Exit(ExitReason::RunnerLost), "runner_lost"),
            (EndReason::ExitCode(-3), "exit code -3"),
            (EndReason::Given("done".into()), "done"),
            (EndReason::Given("exit code x".into()), "exit code x"),
        ];
        for (reason, text) in reasons {
            assert_eq!(reason.to_string(), text);
            assert_eq!(EndReason::parse(text), reason, "{text}");
        }
    }

    /// A notice names the end in Troupe's words, never a caller's text.
    #[test]
    fn a_notice_never_passes_a_callers_text_on() {
        let notice = |text: &str| EndReason::parse(text).notice();
        assert_eq!(notice("runner_lost"), "runner_lost");
        assert_eq!(notice("finished"), "finished");
        assert_eq!(notice("cascade"), "cascade");
        assert_eq!(notice("exited"), "exited");
        assert_eq!(notice("exit code 3"), "exited");
        assert_eq!(notice("the secret is 42"), "manual");
    }

    #[test]
    fn event_kinds_are_stored_as_the_protos_names_and_read_back() {
        for kind in EventKind::ALL {
            assert_eq!(kind.as_str(), kind_str(kind.to_proto()));
            assert_eq!(EventKind::parse(kind.as_str()), Some(kind), "{kind}");
        }
        assert_eq!(EventKind::parse("unspecified"), None);
        assert_eq!(EventKind::parse("exploded"), None);
    }

    #[test]
    fn exit_reasons_read_back_and_unknown_text_is_refused() {
        for reason in ExitReason::ALL {
            assert_eq!(ExitReason::parse(reason.as_str()), Some(reason), "{reason}");
        }
        assert_eq!(ExitReason::parse("Exited"), None);
        assert_eq!(ExitReason::parse(""), None);
    }

    #[test]
    fn parent_end_policies_read_back_and_unspecified_is_terminate() {
        for policy in ParentEnd::ALL {
            assert_eq!(ParentEnd::parse(policy.as_str()), Some(policy));
            assert_eq!(ParentEnd::from_proto(policy.to_proto()), policy);
        }
        assert_eq!(
            ParentEnd::from_proto(pb::ParentEndPolicy::Unspecified),
            ParentEnd::Terminate
        );
        assert_eq!(ParentEnd::parse("Abandon"), None);
    }

    #[test]
    fn principals_read_back_and_a_session_needs_an_id() {
        for (principal, text) in [
            (Principal::Operator, "operator"),
            (Principal::Session("sess_a".into()), "session:sess_a"),
            (Principal::Troupe, "troupe"),
            (Principal::Anonymous, "anonymous"),
        ] {
            assert_eq!(principal.to_string(), text);
            assert_eq!(Principal::parse(text), Some(principal));
        }
        for bad in ["session:", "session", "Operator", ""] {
            assert_eq!(Principal::parse(bad), None, "{bad:?}");
        }
    }
}
