//! What the store's writes take and return: the rules they run inside
//! their transaction (as closures), whose rate a message counts against,
//! and what a write did.

use crate::{
    error::{QuotaLeft, SessionError},
    model::{
        Account, Audience, EventRow, MessageRate, Principal, Reach, Sending, SessionId, SessionRow,
    },
    policy::{Admission, SpawnContext},
};

/// Checks a spawn inside the store's transaction.
pub type SpawnCheck<'a> = &'a (dyn Fn(&SpawnContext<'_>) -> Result<Admission, SessionError> + Sync);
/// Checks a new root given the workspace's active session count.
pub type RootCheck<'a> = &'a (dyn Fn(u32) -> Result<QuotaLeft, SessionError> + Sync);
/// Checks a message given its recipient.
pub type MessageCheck<'a> = &'a (dyn Fn(&SessionRow) -> Result<(), SessionError> + Sync);
/// Counts messages against their sender's rates: given its rate state and
/// what a write sends, returns its new state, or refuses them all.
pub type RateCheck<'a> =
    &'a (dyn Fn(MessageRate, Sending) -> Result<MessageRate, SessionError> + Sync);
/// Checks that an inbox holding the first number of unread bytes takes a
/// message of the second.
pub type InboxCheck<'a> = &'a (dyn Fn(u64, u64) -> Result<(), SessionError> + Sync);
/// Plans a message to many given its candidate recipients, as the store
/// resolved them inside the write's transaction: each to reach, once.
pub type FanOutCheck<'a> =
    &'a (dyn Fn(&[SessionRow]) -> Result<Vec<(SessionId, Reach)>, SessionError> + Sync);
/// Checks the sessions to add to a group given their rows and the rows of
/// every member the group would hold after (those added included), so that
/// a rule may count only the members its caller may see.
pub type MembersCheck<'a> =
    &'a (dyn Fn(&[SessionRow], &[SessionRow]) -> Result<(), SessionError> + Sync);

/// Whose message rate a write counts against, and the rule.
#[derive(Clone, Copy)]
pub struct Throttle<'a> {
    pub sender: &'a str,
    pub check: RateCheck<'a>,
}

/// The bounds a message write holds inside its transaction: its sender's
/// rates (none for the operator's) and each recipient's unread inbox bytes.
#[derive(Clone, Copy)]
pub struct Bounds<'a> {
    pub throttle: Option<Throttle<'a>>,
    pub inbox: InboxCheck<'a>,
}

/// A message to many, as a [`crate::MessageStore::fan_out`] stores it.
#[derive(Clone, Debug)]
pub struct FanOut {
    pub audience: Audience,
    pub sender: Principal,
    pub body: String,
}

/// Checks a termination given its target and the target's ancestors, nearest first.
pub type TerminateCheck<'a> =
    &'a (dyn Fn(&SessionRow, &[SessionId]) -> Result<(), SessionError> + Sync);

/// Checks a model call's reservation given its session and the accounts of
/// the session's path, root first (the session's last).
pub type ChargeCheck<'a> = &'a (dyn Fn(&SessionRow, &[Account]) -> Result<(), SessionError> + Sync);

/// What a create did.
#[derive(Clone, Debug)]
pub enum Created {
    /// A new session, and the quota left after it.
    New {
        session: Box<SessionRow>,
        quota: QuotaLeft,
    },
    /// An earlier call with the same request id created this session.
    Replayed {
        session_id: String,
        quota: QuotaLeft,
    },
}

/// What a send did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    pub message_id: String,
    pub sequence: u64,
    pub replayed: bool,
}

/// What one round of [`crate::UpkeepStore::maintain`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Maintenance {
    /// Database pages returned to the file system.
    pub pages_returned: u64,
}

/// A page of events, and whether the cursor asked for was already pruned.
#[derive(Clone, Debug)]
pub enum EventPage {
    Events(Vec<EventRow>),
    /// Events of `shard` after the cursor's position there were pruned; its
    /// oldest kept follows `pruned_through`.
    Expired {
        shard: crate::shard::Shard,
        pruned_through: i64,
    },
}
