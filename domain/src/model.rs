//! The records the service reasons about: sessions, callers, events, audit
//! entries. Plain data, shared by the rules ([`crate::policy`]) and the
//! store (`troupe_session_svc::store`).

use std::time::{SystemTime, UNIX_EPOCH};

pub use troupe_proto::scope::WriteScope;
use troupe_proto::session::{SessionStatus, TrustLevel};
use troupe_telemetry::LifeSpan;

mod action;
mod budget;
mod console;
mod event_detail;
mod finish;
mod groups;
mod ids;
mod messages;
mod shared;
mod values;

mod runner;

pub use action::Action;
pub use budget::{
    Account, Budget, BudgetLeft, CallOutcome, Charge, Cost, Dimension, ModelCall, OwnUsage,
    PRICE_DECIMALS, Price, Reservation, TokenUsage,
};
pub use console::{ConsoleSession, ConsoleSessionId, CsrfToken, MessageRecord, SessionActivity};
pub use event_detail::{
    Created, Delivered, Ended, EventDetail, Finished, MessageQueued, Nothing, Orphaned, Output,
    OutputTruncated, OwnUsed, ProgressReport, Terminated, Usage, Used,
};
pub use finish::{Finish, Outcome};
pub use groups::{Audience, FannedOut, GroupName, GroupRow, Reach, Reached, new_message_id};
pub use ids::{SessionId, TreeId, WorkspaceId};
pub use messages::{MessageRate, Sending};
pub use runner::{RunnerName, RunnerRow, RunnerSpec, STATIC_RUNNER};
pub use shared::{AgentScope, NewAgent, OperatorToken, StoredAgent};
pub use values::{EndReason, EventKind, ExitReason, ParentEnd, Principal};

/// A session's trust level. Only ever narrows from parent to child.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trust {
    Direct,
    Sandboxed,
}

impl Trust {
    pub fn as_str(self) -> &'static str {
        match self {
            Trust::Direct => "direct",
            Trust::Sandboxed => "sandboxed",
        }
    }

    /// Parses the stored form (`direct` / `sandboxed`).
    pub fn from_db(text: &str) -> Option<Trust> {
        match text {
            "direct" => Some(Trust::Direct),
            "sandboxed" => Some(Trust::Sandboxed),
            _ => None,
        }
    }

    /// Maps the wire enum; `None` for unspecified.
    pub fn from_proto(level: TrustLevel) -> Option<Trust> {
        match level {
            TrustLevel::Direct => Some(Trust::Direct),
            TrustLevel::Sandboxed => Some(Trust::Sandboxed),
            TrustLevel::Unspecified => None,
        }
    }

    pub fn to_proto(self) -> TrustLevel {
        match self {
            Trust::Direct => TrustLevel::Direct,
            Trust::Sandboxed => TrustLevel::Sandboxed,
        }
    }
}

/// One row of the spawn tree.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionRow {
    pub session_id: SessionId,
    pub workspace_id: WorkspaceId,
    pub parent_session_id: Option<SessionId>,
    pub parent_trust: Option<Trust>,
    pub tree_id: TreeId,
    pub depth: u32,
    pub trust: Trust,
    pub agent_name: String,
    /// JSON array of the agent's argv.
    pub agent_command: String,
    pub title: String,
    pub status: SessionStatus,
    pub created_by: Principal,
    pub created_at_ms: i64,
    pub ended_at_ms: Option<i64>,
    pub end_reason: Option<EndReason>,
    pub spawn_tat_ms: i64,
    pub inbox_seq: i64,
    /// Its life span in its tree's trace; `None` when untraced.
    pub trace: Option<LifeSpan>,
    /// What its agent may write (unscoped: the whole workspace).
    pub write_scope: WriteScope,
    /// What happens to it when its parent ends.
    pub on_parent_end: ParentEnd,
    /// Its parent ended while it stayed active.
    pub orphaned: bool,
}

impl SessionRow {
    /// Returns true while the session is pending or running.
    pub fn is_active(&self) -> bool {
        !troupe_proto::status::is_ended(self.status)
    }
}

/// Who is calling, as established from the token and the database.
#[derive(Clone, Debug)]
pub enum Caller {
    Operator,
    /// An agent, acting as this session (the row as read when the call arrived).
    Session(Box<SessionRow>),
}

impl Caller {
    /// Returns who this is, as the audit log, senders and creators name it.
    pub fn principal(&self) -> Principal {
        match self {
            Caller::Operator => Principal::Operator,
            Caller::Session(s) => Principal::Session(s.session_id.clone()),
        }
    }
}

/// A session to insert.
#[derive(Clone, Debug)]
pub struct NewSession {
    pub session_id: SessionId,
    pub workspace_id: WorkspaceId,
    pub trust: Trust,
    pub agent_name: String,
    pub agent_command: String,
    pub title: String,
    pub created_by: Principal,
    /// Its life span, planned in the spawn span; `None` when untraced.
    pub trace: Option<LifeSpan>,
    /// Stored as the first message of the new session's inbox.
    pub initial_message: Option<NewMessage>,
    /// CALLBACK mode: its parent is told when it ends.
    pub notify_parent: bool,
    /// Its own budget (empty: none).
    pub budget: Budget,
    /// What its agent may write (unscoped: the whole workspace).
    pub write_scope: WriteScope,
    /// What happens to it when its parent ends.
    pub on_parent_end: ParentEnd,
}

/// A message to store in an inbox.
#[derive(Clone, Debug)]
pub struct NewMessage {
    pub message_id: String,
    pub sender: Principal,
    pub body: String,
}

/// The idempotency key of a call and the hash of what it asked for.
#[derive(Clone, Debug)]
pub struct Idempotency {
    pub caller: Principal,
    pub action: Action,
    pub request_id: String,
    pub payload_hash: String,
    /// Where the request id's window starts (ms since the Unix epoch): an
    /// earlier call's record made before it has expired, and this call is
    /// new (`--request-id-retention-secs`).
    pub window_start_ms: i64,
}

/// One audit entry to append.
#[derive(Clone, Debug)]
pub struct AuditRecord {
    pub caller: Principal,
    pub action: Action,
    pub target: String,
    pub allowed: bool,
    pub reason: String,
    pub detail: String,
}

/// One stored audit entry.
#[derive(Clone, Debug)]
pub struct AuditRow {
    pub id: i64,
    pub at_ms: i64,
    pub caller: String,
    pub action: String,
    pub target: String,
    pub allowed: bool,
    pub reason: String,
    pub detail: String,
}

/// One stored event, joined with its session's hierarchy fields.
#[derive(Clone, Debug)]
pub struct EventRow {
    /// Its shard (its session's) and its position in the shard's order.
    pub shard: crate::shard::Shard,
    pub position: i64,
    pub seq: i64,
    pub kind: EventKind,
    /// The session's status when the event was written.
    pub status: SessionStatus,
    pub at_ms: i64,
    pub detail: String,
    pub session_id: SessionId,
    pub workspace_id: WorkspaceId,
    pub parent_session_id: Option<SessionId>,
    pub parent_trust: Option<Trust>,
    pub tree_id: TreeId,
    pub depth: u32,
    pub trust: Trust,
}

/// Which events a watcher wants, already narrowed to what it may see.
#[derive(Clone, Debug, Default)]
pub struct EventFilter {
    pub session_id: Option<SessionId>,
    pub tree_id: Option<TreeId>,
    pub workspace_id: Option<WorkspaceId>,
    /// Only events of sandboxed sessions.
    pub sandboxed_only: bool,
    /// Only the events that end a session (completed, failed, terminated).
    pub ends_only: bool,
}

impl EventFilter {
    /// The one shard its events lie in, if it names their workspace.
    pub fn shard(&self) -> Option<crate::shard::Shard> {
        self.workspace_id.as_deref().map(crate::shard::Shard::of)
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// What an agent's process did, as the runner reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcessChange {
    Started,
    Output {
        stream: &'static str,
        data: Vec<u8>,
    },
    /// The runner's log dropped output before it was read: the events
    /// before this one's sequence that were not applied are gone.
    Truncated {
        /// What the runner's log had dropped in all, in bytes.
        log_bytes: u64,
    },
    Exited(ProcessExit),
}

/// A chunk of a session's output, as its runner reported it: event
/// `runner_seq` of the process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputChunk {
    pub runner_seq: u64,
    pub stream: &'static str,
    pub data: Vec<u8>,
}

/// Why a session failed with no exit of its agent to tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Its process vanished, or could not be started.
    Lost,
    /// The runner had no room for its agent: the workspace container's
    /// process limit.
    NoResources,
    /// Its runner's registration lapsed (the runner was lost).
    RunnerLost,
}

impl Failure {
    /// The session's end reason.
    pub fn reason(self) -> ExitReason {
        match self {
            Failure::Lost => ExitReason::Lost,
            Failure::NoResources => ExitReason::NoResources,
            Failure::RunnerLost => ExitReason::RunnerLost,
        }
    }
    /// The failure as the exit of a process that never told its own: code
    /// -1 and the failure's reason.
    pub fn exit(self, detail: &str) -> ProcessExit {
        ProcessExit {
            code: -1,
            reason: self.reason(),
            detail: detail.to_owned(),
        }
    }
}

/// How an agent's process ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessExit {
    pub code: i32,
    pub reason: ExitReason,
    pub detail: String,
}

impl ProcessExit {
    /// A clean exit: the session completed; anything else failed.
    pub fn succeeded(&self) -> bool {
        self.code == 0 && self.reason == ExitReason::Exited
    }
}

/// A session's process record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessRow {
    /// Last runner event applied.
    pub runner_seq: u64,
    pub exit_code: Option<i32>,
    pub exit_reason: Option<ExitReason>,
    pub output_tail: Vec<u8>,
    /// Last inbox sequence written to the agent's stdin.
    pub delivered_seq: u64,
    pub notify_parent: bool,
    /// Its parent's CALLBACK notice is owed (set when it ended, cleared when
    /// the notice was written).
    pub callback_due: bool,
    /// The runner it was placed on (`None`: never placed).
    pub runner: Option<RunnerName>,
    /// When a session that finished its task has its process stopped (Unix
    /// ms): the finish's grace runs until then.
    pub stop_after_ms: Option<i64>,
}

/// A message a session received, without its body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceivedMessage {
    pub seq: u64,
    pub message_id: String,
    pub sender: Principal,
    pub created_at_ms: i64,
}

/// A stored message, as delivered to an agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxMessage {
    pub seq: u64,
    pub message_id: String,
    pub sender: Principal,
    pub body: String,
}
