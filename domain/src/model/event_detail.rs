//! What an event says beyond its kind and status: [`EventDetail`], one
//! type for every kind. It is written once ([`EventDetail::to_json`], the
//! text stored in `events.detail`: the variant's fields, untagged) and read
//! once ([`EventDetail::read`], by the event's kind, which the store keeps
//! beside it). A field a stored detail lacks reads as its default.

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use super::{Account, EventKind, Finish};

/// An event's detail, by kind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum EventDetail {
    Created(Created),
    Message(MessageQueued),
    Terminated(Terminated),
    Orphaned(Orphaned),
    Delivered(Delivered),
    Output(Output),
    OutputTruncated(OutputTruncated),
    Progress(ProgressReport),
    Usage(Usage),
    /// A session's own end, with its result (`completed` or `failed`).
    Finished(Finished),
    /// An end by its process's exit (`completed` or `failed`).
    Ended(Ended),
    /// Nothing beyond the kind (`started`).
    Nothing(Nothing),
}

impl EventDetail {
    /// The text stored in `events.detail`.
    pub fn to_json(&self) -> String {
        // Plain structs of strings and integers always serialize.
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }

    /// Reads the detail of an event of `kind` as it was stored; `None` if
    /// it is not one (or the kind has none).
    pub fn read(kind: EventKind, text: &str) -> Option<EventDetail> {
        fn parse<T: DeserializeOwned>(text: &str) -> Option<T> {
            serde_json::from_str(text).ok()
        }
        match kind {
            EventKind::Created => parse(text).map(EventDetail::Created),
            EventKind::Message => parse(text).map(EventDetail::Message),
            EventKind::Terminated => parse(text).map(EventDetail::Terminated),
            EventKind::Orphaned => parse(text).map(EventDetail::Orphaned),
            EventKind::Delivered => parse(text).map(EventDetail::Delivered),
            EventKind::Output => parse(text).map(EventDetail::Output),
            EventKind::OutputTruncated => parse(text).map(EventDetail::OutputTruncated),
            EventKind::Progress => parse(text).map(EventDetail::Progress),
            EventKind::Usage => parse(text).map(EventDetail::Usage),
            EventKind::Completed | EventKind::Failed => {
                let end: Ended = parse(text)?;
                if end.reason == Finish::END_REASON {
                    parse(text).map(EventDetail::Finished)
                } else if end.reason.is_empty() {
                    None
                } else {
                    Some(EventDetail::Ended(end))
                }
            }
            EventKind::Started => None,
        }
    }
}

/// A new session's: its agent and title.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Created {
    pub agent_name: String,
    pub title: String,
}

/// A message appended to the session's inbox.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MessageQueued {
    pub message_id: String,
    /// Its sequence in the inbox.
    pub inbox_sequence: u64,
    /// Its body's size.
    pub bytes: u64,
}

/// A termination: why, by whom, and (by cascade) how the parent ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Terminated {
    pub reason: String,
    /// The principal that terminated it (`troupe`, `operator`, `session:<id>`).
    pub terminated_by: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_ended: Option<String>,
}

/// Its parent ended and it stays active: its policy, the parent's status.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Orphaned {
    pub policy: String,
    pub parent_status: String,
}

/// Its inbox's messages up to `through_sequence` reached its agent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Delivered {
    pub through_sequence: u64,
}

/// A chunk of its output: the stream, the bytes in base64.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Output {
    pub stream: String,
    pub data: String,
}

impl Output {
    /// The detail of `data` printed on `stream`.
    pub fn of(stream: &str, data: &[u8]) -> Output {
        use base64::Engine as _;
        Output {
            stream: stream.to_owned(),
            data: base64::engine::general_purpose::STANDARD.encode(data),
        }
    }

    /// The bytes printed (none if the stored text is not base64).
    pub fn bytes(&self) -> Vec<u8> {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(&self.data)
            .unwrap_or_default()
    }
}

/// Output that was dropped: by the store's budgets, or by the runner's log
/// (`by_runner`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct OutputTruncated {
    pub dropped_bytes: u64,
    pub dropped_events: u64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub by_runner: bool,
}

/// A progress report, as its session made it (also kept as the session's
/// last, `sessions.last_progress`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressReport {
    /// Percent done, 0 to 100 (a stored detail without it is none).
    pub progress: u32,
    #[serde(default)]
    pub description: String,
}

impl ProgressReport {
    /// The report of a stored progress detail.
    pub fn from_detail(detail: &str) -> Option<ProgressReport> {
        serde_json::from_str(detail).ok()
    }
}

/// A session's usage after a model call settled: its own, its subtree's,
/// and what its subtree has reserved.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Usage {
    pub own: OwnUsed,
    pub subtree: Used,
    pub reserved: Used,
}

/// A session's own usage, tokens by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct OwnUsed {
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    pub cost_pico_usd: u64,
}

/// Calls, tokens and cost.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Used {
    pub calls: u64,
    pub tokens: u64,
    pub cost_pico_usd: u64,
}

impl Usage {
    /// The usage an account holds.
    pub fn of(account: &Account) -> Usage {
        let used = |c: &super::Charge| Used {
            calls: c.calls,
            tokens: c.tokens,
            cost_pico_usd: c.cost.0,
        };
        Usage {
            own: OwnUsed {
                calls: account.own.calls,
                input_tokens: account.own.tokens.input,
                output_tokens: account.own.tokens.output,
                cache_read_tokens: account.own.tokens.cache_read,
                cache_write_tokens: account.own.tokens.cache_write,
                cost_pico_usd: account.own.cost.0,
            },
            subtree: used(&account.subtree),
            reserved: used(&account.reserved),
        }
    }
}

/// A session's own end: its outcome and result (`reason` is always
/// [`Finish::END_REASON`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Finished {
    pub reason: String,
    pub outcome: String,
    pub result: String,
}

/// An end by its process's exit: the code, the exit's reason and detail.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Ended {
    pub exit_code: i32,
    pub reason: String,
    pub detail: String,
}

impl Default for Ended {
    /// An exit code not known reads as -1.
    fn default() -> Ended {
        Ended {
            exit_code: -1,
            reason: String::new(),
            detail: String::new(),
        }
    }
}

/// No detail: stored as `{}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nothing {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind's detail reads back as it was written.
    #[test]
    fn each_detail_reads_back_by_its_kind() {
        let details = [
            (
                EventKind::Created,
                EventDetail::Created(Created {
                    agent_name: "worker".into(),
                    title: "t".into(),
                }),
            ),
            (
                EventKind::Message,
                EventDetail::Message(MessageQueued {
                    message_id: "msg_1".into(),
                    inbox_sequence: 3,
                    bytes: 5,
                }),
            ),
            (
                EventKind::Terminated,
                EventDetail::Terminated(Terminated {
                    reason: "cascade".into(),
                    terminated_by: "troupe".into(),
                    parent_ended: Some("failed".into()),
                }),
            ),
            (
                EventKind::Output,
                EventDetail::Output(Output::of("stdout", b"\0hi")),
            ),
            (
                EventKind::OutputTruncated,
                EventDetail::OutputTruncated(OutputTruncated {
                    dropped_bytes: 9,
                    dropped_events: 2,
                    by_runner: true,
                }),
            ),
            (
                EventKind::Completed,
                EventDetail::Finished(Finished {
                    reason: Finish::END_REASON.into(),
                    outcome: "success".into(),
                    result: "done".into(),
                }),
            ),
            (
                EventKind::Failed,
                EventDetail::Ended(Ended {
                    exit_code: 3,
                    reason: "exited".into(),
                    detail: String::new(),
                }),
            ),
        ];
        for (kind, detail) in details {
            assert_eq!(
                EventDetail::read(kind, &detail.to_json()),
                Some(detail),
                "{kind:?}"
            );
        }
    }

    /// The stored text is the variant's fields alone, as it always was.
    #[test]
    fn the_stored_text_is_untagged() {
        let detail = EventDetail::Terminated(Terminated {
            reason: "manual".into(),
            terminated_by: "operator".into(),
            parent_ended: None,
        });
        assert_eq!(
            detail.to_json(),
            r#"{"reason":"manual","terminated_by":"operator"}"#
        );
        assert_eq!(EventDetail::Nothing(Nothing {}).to_json(), "{}");
        assert_eq!(
            Output::of("stdout", b"\0hi"),
            Output {
                stream: "stdout".into(),
                data: "AGhp".into()
            }
        );
    }

    /// A missing field reads as its default; an end without a reason, or
    /// text that is not JSON, reads as none.
    #[test]
    fn what_a_stored_detail_lacks_reads_as_the_default() {
        assert_eq!(
            EventDetail::read(EventKind::Failed, r#"{"reason":"runner_lost"}"#),
            Some(EventDetail::Ended(Ended {
                exit_code: -1,
                reason: "runner_lost".into(),
                detail: String::new(),
            }))
        );
        assert_eq!(EventDetail::read(EventKind::Completed, "{}"), None);
        assert_eq!(EventDetail::read(EventKind::Created, "not json"), None);
        assert_eq!(EventDetail::read(EventKind::Started, "{}"), None);
    }
}
