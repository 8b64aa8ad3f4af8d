//! The session row's columns and what a write on the writer shares: the
//! rollback that ends what a cancelled write left open, and [`Write`], an
//! ordinary transaction for the background work's pruning. Creates and
//! messages go as one batch (`batched`); ends and the runner's reports as
//! `writer::Tx`, both written once (see `backends`).

use sqlx::{Sqlite, SqliteConnection, Transaction, sqlite::SqliteRow};

use super::open::RawSession;
use crate::{error::SessionError, lease::PRUNED_ACTIONS, model::SessionRow};

/// Expands to the session columns, in [`RawSession`]'s field order, for `concat!`.
macro_rules! session_columns {
    () => {
        "rowid AS row_id, session_id, workspace_id, parent_session_id, parent_trust_level, tree_id, \
         depth, trust_level, agent_name, agent_command, title, status, created_by, created_at_ms, \
         ended_at_ms, end_reason, spawn_tat_ms, inbox_seq, traceparent, spawn_span_id, writable_paths, on_parent_end, orphaned, \
         0 AS children"
    };
}
pub(super) use session_columns;

/// Reads a session row (with its rowid) from a statement's result.
pub(super) fn entry_from_row(row: &SqliteRow) -> Result<(i64, SessionRow), SessionError> {
    use sqlx::FromRow;
    let raw = RawSession::from_row(row)?;
    Ok((raw.row_id, raw.into_row()?))
}

/// Ends whatever transaction a failed or cancelled write left open ("no
/// transaction is active" when there is none, which is fine).
pub(super) async fn rollback(conn: &mut SqliteConnection) {
    let _ = sqlx::query("ROLLBACK").execute(conn).await;
}

/// An open write transaction, a round trip per statement.
pub(super) struct Write<'c> {
    tx: Transaction<'c, Sqlite>,
}

impl<'c> Write<'c> {
    pub async fn begin(conn: &'c mut SqliteConnection) -> Result<Self, SessionError> {
        use sqlx::Connection;
        Ok(Write {
            tx: conn.begin_with("BEGIN IMMEDIATE").await?,
        })
    }

    /// The transaction's connection, for statements of other modules.
    pub fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }

    pub async fn commit(self) -> Result<(), SessionError> {
        Ok(self.tx.commit().await?)
    }

    /// Deletes at most `limit` request-id records of callers' calls made
    /// before `before_ms`; returns how many went.
    pub async fn prune_request_ids(
        &mut self,
        before_ms: i64,
        limit: u32,
    ) -> Result<u64, SessionError> {
        let [a, b, c, d, e, f] = PRUNED_ACTIONS;
        let done = sqlx::query(
            "DELETE FROM idempotency WHERE rowid IN (SELECT rowid FROM idempotency \
               WHERE created_at_ms < ?1 AND action IN (?2, ?3, ?4, ?5, ?6, ?7) LIMIT ?8)",
        )
        .bind(before_ms)
        .bind(a)
        .bind(b)
        .bind(c)
        .bind(d)
        .bind(e)
        .bind(f)
        .bind(i64::from(limit))
        .execute(&mut *self.tx)
        .await?;
        Ok(done.rows_affected())
    }
}

/// Appends an inbox entry: message id, sender, body id, bytes, time,
/// recipient (its sequence and unread bytes follow by trigger); returns its
/// `seq`. The body's text stays in `message_bodies`.
pub(super) const INSERT_ENTRY: &str = "INSERT INTO messages (message_id, session_id, seq, sender, \
     body, body_id, bytes, created_at_ms) \
     SELECT $1, session_id, inbox_seq + 1, $2, '', $3, $4, $5 FROM sessions WHERE session_id = $6 \
     RETURNING seq";
