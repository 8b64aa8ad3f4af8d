//! Text forms of session statuses and event kinds, as the CLI and the
//! database spell them.

use crate::session::{EventKind, ParentEndPolicy, SessionStatus};

/// Returns the lowercase name of a status (`pending`, `running`, ...).
pub fn status_str(status: SessionStatus) -> &'static str {
    match status {
        SessionStatus::Unspecified => "unspecified",
        SessionStatus::Pending => "pending",
        SessionStatus::Running => "running",
        SessionStatus::Completed => "completed",
        SessionStatus::Failed => "failed",
        SessionStatus::Terminated => "terminated",
    }
}

/// Parses the lowercase name of a status.
pub fn parse_status(text: &str) -> Option<SessionStatus> {
    Some(match text {
        "pending" => SessionStatus::Pending,
        "running" => SessionStatus::Running,
        "completed" => SessionStatus::Completed,
        "failed" => SessionStatus::Failed,
        "terminated" => SessionStatus::Terminated,
        _ => return None,
    })
}

/// Returns true for statuses after which a session never runs again.
pub fn is_ended(status: SessionStatus) -> bool {
    matches!(
        status,
        SessionStatus::Completed | SessionStatus::Failed | SessionStatus::Terminated
    )
}

/// Returns the lowercase name of an event kind (`created`, `message`, ...).
pub fn kind_str(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Unspecified => "unspecified",
        EventKind::Created => "created",
        EventKind::Started => "started",
        EventKind::Output => "output",
        EventKind::Progress => "progress",
        EventKind::Message => "message",
        EventKind::Completed => "completed",
        EventKind::Failed => "failed",
        EventKind::Terminated => "terminated",
        EventKind::OutputTruncated => "output_truncated",
        EventKind::Usage => "usage",
        EventKind::Orphaned => "orphaned",
        EventKind::Delivered => "delivered",
    }
}

/// Parses the lowercase name of an event kind.
pub fn parse_kind(text: &str) -> Option<EventKind> {
    Some(match text {
        "created" => EventKind::Created,
        "started" => EventKind::Started,
        "output" => EventKind::Output,
        "progress" => EventKind::Progress,
        "message" => EventKind::Message,
        "completed" => EventKind::Completed,
        "failed" => EventKind::Failed,
        "terminated" => EventKind::Terminated,
        "output_truncated" => EventKind::OutputTruncated,
        "usage" => EventKind::Usage,
        "orphaned" => EventKind::Orphaned,
        "delivered" => EventKind::Delivered,
        _ => return None,
    })
}

/// Returns the name of a parent-end policy (`terminate`, `abandon`,
/// `notify`); unspecified is `terminate`, its default.
pub fn parent_end_str(policy: ParentEndPolicy) -> &'static str {
    match policy {
        ParentEndPolicy::Unspecified | ParentEndPolicy::Terminate => "terminate",
        ParentEndPolicy::Abandon => "abandon",
        ParentEndPolicy::Notify => "notify",
    }
}

/// Parses the name of a parent-end policy.
pub fn parse_parent_end(text: &str) -> Option<ParentEndPolicy> {
    Some(match text {
        "terminate" => ParentEndPolicy::Terminate,
        "abandon" => ParentEndPolicy::Abandon,
        "notify" => ParentEndPolicy::Notify,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_round_trip() {
        for s in [
            SessionStatus::Pending,
            SessionStatus::Running,
            SessionStatus::Completed,
            SessionStatus::Failed,
            SessionStatus::Terminated,
        ] {
            assert_eq!(parse_status(status_str(s)), Some(s));
        }
        for k in [
            EventKind::Created,
            EventKind::Started,
            EventKind::Output,
            EventKind::Progress,
            EventKind::Message,
            EventKind::Completed,
            EventKind::Failed,
            EventKind::Terminated,
            EventKind::OutputTruncated,
            EventKind::Usage,
            EventKind::Orphaned,
            EventKind::Delivered,
        ] {
            assert_eq!(parse_kind(kind_str(k)), Some(k));
        }
    }

    #[test]
    fn parent_end_names_round_trip() {
        for p in [
            ParentEndPolicy::Terminate,
            ParentEndPolicy::Abandon,
            ParentEndPolicy::Notify,
        ] {
            assert_eq!(parse_parent_end(parent_end_str(p)), Some(p));
        }
        assert_eq!(parent_end_str(ParentEndPolicy::Unspecified), "terminate");
        assert_eq!(parse_parent_end("orphan"), None);
    }
}
