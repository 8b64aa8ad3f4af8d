//! What a message costs its sender and its recipient: the sender's rate
//! state (in messages and in bytes) and what one write sends.

/// A session's message rate state: the theoretical arrival times of the
/// generic cell rate algorithm, one in messages and one in bytes (0: it has
/// sent nothing yet). Kept per session in the database.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MessageRate {
    pub messages_tat_ms: i64,
    pub bytes_tat_ms: i64,
}

/// What one write stores in other sessions' inboxes: how many messages,
/// and their bytes in all (a broadcast's body once per recipient).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sending {
    pub messages: usize,
    pub bytes: u64,
}

impl Sending {
    /// `body` to `recipients` sessions.
    pub fn to_each(recipients: usize, body: &str) -> Sending {
        Sending {
            messages: recipients,
            bytes: (body.len() as u64).saturating_mul(recipients as u64),
        }
    }
}
