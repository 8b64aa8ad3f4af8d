//! Reads of a session's inbox and of its process record, written once for
//! both backends (see `backends`), on the read pool.

use std::future::Future;

use super::backends::each_backend;
use crate::{
    error::SessionError,
    model::{InboxMessage, ReceivedMessage, SessionId},
};

/// A session's inbox as its agent and its readers see it; every
/// [`super::Store`] is one.
pub trait InboxStore: Send + Sync {
    /// Counts the messages in a session's inbox.
    fn inbox_count(
        &self,
        session_id: &SessionId,
    ) -> impl Future<Output = Result<u64, SessionError>> + Send;

    /// Returns how many of a session's inbox messages its agent has not
    /// been handed yet (`delivered_at_ms` unset).
    fn unread_count(
        &self,
        session_id: &SessionId,
    ) -> impl Future<Output = Result<u64, SessionError>> + Send;

    /// Returns the inbox messages not yet written to the agent, in order.
    fn undelivered(
        &self,
        session_id: &SessionId,
    ) -> impl Future<Output = Result<Vec<InboxMessage>, SessionError>> + Send;

    /// Returns the first `limit` messages a session received, in order.
    fn received(
        &self,
        session_id: &SessionId,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<ReceivedMessage>, SessionError>> + Send;
}

each_backend! {


    use super::InboxStore;
    use crate::{
        error::SessionError,
        model::{SessionId, InboxMessage, Principal, ReceivedMessage},
        parse_stored,
    };

    impl InboxStore for This {
        async fn inbox_count(&self, session_id: &SessionId) -> Result<u64, SessionError> {
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages WHERE session_id = $1")
                .bind(session_id)
                .fetch_one(&self.pool)
                .await?;
            Ok(n as u64)
        }

        async fn unread_count(&self, session_id: &SessionId) -> Result<u64, SessionError> {
            let n: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM messages WHERE session_id = $1 AND delivered_at_ms IS NULL",
            )
            .bind(session_id)
            .fetch_one(&self.pool)
            .await?;
            Ok(n as u64)
        }

        async fn undelivered(&self, session_id: &SessionId) -> Result<Vec<InboxMessage>, SessionError> {
            let rows: Vec<(i64, String, String, String)> = sqlx::query_as(
                "SELECT m.seq, m.message_id, m.sender, COALESCE(b.body, m.body) \
                 FROM messages m \
                 LEFT JOIN message_bodies b ON b.body_id = m.body_id \
                 LEFT JOIN processes p ON p.session_id = m.session_id \
                 WHERE m.session_id = $1 AND m.seq > COALESCE(p.delivered_seq, 0) ORDER BY m.seq",
            )
            .bind(session_id)
            .fetch_all(&self.pool)
            .await?;
            rows.into_iter()
                .map(|(seq, message_id, sender, body)| {
                    Ok(InboxMessage {
                        seq: seq as u64,
                        message_id,
                        sender: parse_stored("sender", &sender, Principal::parse)?,
                        body,
                    })
                })
                .collect()
        }

        async fn received(
            &self,
            session_id: &SessionId,
            limit: u32,
        ) -> Result<Vec<ReceivedMessage>, SessionError> {
            let rows: Vec<(i64, String, String, i64)> = sqlx::query_as(
                "SELECT seq, message_id, sender, created_at_ms FROM messages \
                 WHERE session_id = $1 ORDER BY seq LIMIT $2",
            )
            .bind(session_id)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
            rows.into_iter()
                .map(|(seq, message_id, sender, created_at_ms)| {
                    Ok(ReceivedMessage {
                        seq: seq as u64,
                        message_id,
                        sender: parse_stored("sender", &sender, Principal::parse)?,
                        created_at_ms,
                    })
                })
                .collect()
        }
    }
}
