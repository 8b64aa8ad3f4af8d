//! Reads of a session's inbox, written once for both backends (see
//! `backends`), on the read pool.

use super::backends::each_backend;

each_backend! {
    use crate::error::SessionError;

    impl This {
        /// Counts the messages in a session's inbox.
        pub(in crate::store) async fn inbox_count_impl(
            &self,
            session_id: &str,
        ) -> Result<u64, SessionError> {
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages WHERE session_id = $1")
                .bind(session_id)
                .fetch_one(&self.pool)
                .await?;
            Ok(n as u64)
        }

        /// Counts the messages of a session's inbox not yet handed to its agent.
        pub(in crate::store) async fn unread_count_impl(
            &self,
            session_id: &str,
        ) -> Result<u64, SessionError> {
            let n: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM messages WHERE session_id = $1 AND delivered_at_ms IS NULL",
            )
            .bind(session_id)
            .fetch_one(&self.pool)
            .await?;
            Ok(n as u64)
        }
    }
}
