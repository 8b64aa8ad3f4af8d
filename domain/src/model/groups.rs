//! Broadcasts and named groups: who a message to many goes to
//! ([`Audience`]), what each candidate recipient is to its sender
//! ([`Reach`]), what each got ([`Reached`]), and a group as stored
//! ([`GroupRow`]).

use super::{SessionId, SessionRow, WorkspaceId};

/// A new message's id (`msg_<uuid v7>`).
pub fn new_message_id() -> String {
    format!("msg_{}", uuid::Uuid::now_v7().simple())
}

/// A group's name: a slug, unique in its workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupName(String);

impl GroupName {
    /// Parses a name (`field` names it in the refusal).
    pub fn parse(field: &'static str, name: &str) -> Result<GroupName, crate::error::SessionError> {
        crate::agent::validate_slug(field, name)?;
        Ok(GroupName(name.to_owned()))
    }

    /// A name as the store read it back (validated when it was stored).
    pub fn stored(name: String) -> GroupName {
        GroupName(name)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The candidate recipients of a message to many, resolved by the store
/// inside the write's transaction.
#[derive(Clone, Debug)]
pub enum Audience {
    /// The active sessions of a workspace.
    Workspace(WorkspaceId),
    /// The active descendants of a session (not the session itself).
    Subtree(SessionId),
    /// The active children of a session.
    Children(SessionId),
    /// The members of a group but its poster, who must be a member (else
    /// the group is not found).
    Group {
        workspace_id: WorkspaceId,
        name: GroupName,
        poster: SessionId,
    },
}

/// What a candidate recipient is to the sender ([`crate::policy::reach`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// It gets the message.
    Deliver,
    /// The sender sees it, but it has ended: reported, nothing stored.
    Ended,
    /// The sender may not see it (or it is the sender): neither a recipient
    /// nor named in the answer.
    Hidden,
    /// It would get the message, but its inbox holds as many unread bytes
    /// as one may: reported, nothing stored, nothing counted.
    InboxFull,
}

/// What one recipient got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reached {
    Delivered {
        session_id: SessionId,
        message_id: String,
        sequence: u64,
    },
    Ended {
        session_id: SessionId,
    },
    InboxFull {
        session_id: SessionId,
    },
}

impl Reached {
    pub fn session_id(&self) -> &str {
        match self {
            Reached::Delivered { session_id, .. }
            | Reached::Ended { session_id }
            | Reached::InboxFull { session_id } => session_id,
        }
    }
}

/// What a message to many did: each recipient the sender sees, once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FannedOut {
    pub reached: Vec<Reached>,
    /// An earlier call with the same request id did it.
    pub replayed: bool,
}

/// A group as stored, with its members' rows (oldest member first).
#[derive(Clone, Debug)]
pub struct GroupRow {
    pub group_id: String,
    pub workspace_id: WorkspaceId,
    pub name: GroupName,
    pub created_by: String,
    pub created_at_ms: i64,
    pub members: Vec<SessionRow>,
}
