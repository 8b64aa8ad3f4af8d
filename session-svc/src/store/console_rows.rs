//! A `messages` row as both stores read it for the console
//! ([`crate::store::Store::session_messages`]).

use super::parse_stored;
use crate::{
    error::SessionError,
    model::{MessageRecord, Principal},
};

#[derive(sqlx::FromRow)]
pub(crate) struct MessageColumns {
    message_id: String,
    session_id: String,
    seq: i64,
    sender: String,
    body: String,
    created_at_ms: i64,
    delivered_at_ms: Option<i64>,
}

impl MessageColumns {
    pub(crate) fn into_record(self) -> Result<MessageRecord, SessionError> {
        Ok(MessageRecord {
            sender: parse_stored("sender", &self.sender, Principal::parse)?,
            message_id: self.message_id,
            session_id: self.session_id,
            seq: u64::try_from(self.seq).unwrap_or_default(),
            body: self.body,
            created_at_ms: self.created_at_ms,
            delivered_at_ms: self.delivered_at_ms,
        })
    }
}
