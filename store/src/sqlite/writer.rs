//! The writer's discipline: taking the one writer connection (settling what
//! a cancelled write left), and [`Tx`], a transaction of its own on it,
//! whose changed rows go to the ledger at its commit.
//!
//! A write marks the sessions it changes as unsettled before its commit
//! and clears them once the ledger has its result. If its future is
//! dropped in between (a client hung up), the next writer rolls back what
//! is open and rereads those rows.
//! Whoever takes the writer lock (tokio's, fair) while the write-ahead log
//! is past its limit first cuts it back.

use sqlx::SqliteConnection;
use tokio::sync::{MappedMutexGuard, MutexGuard};

use super::{
    SqliteStore, Writer,
    write::{entry_from_row, rollback, session_columns},
};
use crate::{
    error::SessionError,
    journal::NewEvent,
    model::{SessionId, SessionRow, now_ms},
};
use troupe_proto::status::status_str;

/// A write transaction of its own on the writer (`BEGIN IMMEDIATE`), for
/// code written once for both backends (see `backends`). Dropped
/// before its commit, the next writer rolls it back. The rows its
/// statements change (through its own methods, see `ends`) reach the
/// ledger at its commit.
pub(crate) struct Tx<'s> {
    pub(super) store: &'s SqliteStore,
    w: MutexGuard<'s, Writer>,
    changes: Vec<Change>,
}

/// A change of a session's row that the ledger takes at the commit.
pub(super) enum Change {
    /// The row as a statement returned it (with its rowid).
    Row(i64, Box<SessionRow>),
    /// A message appended to its inbox: its new sequence.
    InboxSeq(String, i64),
}

impl Change {
    fn session_id(&self) -> &str {
        match self {
            Change::Row(_, row) => &row.session_id,
            Change::InboxSeq(id, _) => id,
        }
    }
}

impl Tx<'_> {
    /// The transaction's connection.
    pub(crate) fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.w.conn
    }

    /// Records `change` for the ledger, at the commit.
    pub(super) fn changed(&mut self, change: Change) {
        self.changes.push(change);
    }

    /// Commits, then puts the rows it changed in the ledger. Those rows are
    /// unsettled from before `COMMIT` until the ledger has them: if the
    /// caller goes away in between, the next writer rereads them.
    pub(crate) async fn commit(mut self) -> Result<(), SessionError> {
        self.w.unsettled = self.changes.iter().map(|c| c.session_id().into()).collect();
        let done = sqlx::query("COMMIT").execute(&mut self.w.conn).await;
        let done = self.w.or_abandon(done.map_err(SessionError::from)).await;
        self.w.open = false;
        done?;
        let mut ledger = self.store.ledger_mut();
        for change in self.changes.drain(..) {
            match change {
                Change::Row(rowid, row) => ledger.put(rowid, *row),
                Change::InboxSeq(id, seq) => ledger.update(&id, |row| row.inbox_seq = seq),
            }
        }
        drop(ledger);
        self.w.unsettled.clear();
        Ok(())
    }
}

/// Runs one whole transaction: SQLite's writer never loses a lock conflict,
/// so once (PostgreSQL's runs it again; see `backends`).
macro_rules! retrying {
    ($attempt:expr) => {
        $attempt.await
    };
}
pub(crate) use retrying;

/// "Is one of the JSON array of texts bound as parameter `$n`", in
/// SQLite's words: the right-hand side of a predicate on a column.
macro_rules! any_of {
    ($n:literal) => {
        concat!("IN (SELECT value FROM json_each($", $n, "))")
    };
}
pub(crate) use any_of;

/// Locks the rows a `SELECT` reads (` FOR UPDATE`, or ` FOR` and the lock
/// given), in SQLite's words: nothing (its writer lock serialises every
/// write already).
macro_rules! for_update {
    () => {
        ""
    };
    ($lock:literal) => {
        ""
    };
}
pub(crate) use for_update;

/// The database's clock, in milliseconds since the Unix epoch, in
/// SQLite's words.
macro_rules! db_now_ms {
    () => {
        "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
    };
}
pub(crate) use db_now_ms;

/// The column that orders sessions by creation, in SQLite's words (its
/// `rowid`).
macro_rules! row_order {
    () => {
        "rowid"
    };
}
pub(crate) use row_order;

impl SqliteStore {
    /// Begins a write transaction on the writer.
    pub(crate) async fn tx(&self) -> Result<Tx<'_>, SessionError> {
        let mut w = self.writer().await?;
        w.open = true;
        sqlx::query("BEGIN IMMEDIATE").execute(&mut w.conn).await?;
        Ok(Tx {
            store: self,
            w,
            changes: Vec::new(),
        })
    }

    /// The rows of the sessions `ids` that exist, in the order of `ids`,
    /// from the ledger (exact under the writer lock; `_conn` is the
    /// transaction's, for PostgreSQL's reading of them).
    pub(crate) async fn rows_of(
        &self,
        _conn: &mut SqliteConnection,
        ids: &[SessionId],
    ) -> Result<Vec<SessionRow>, SessionError> {
        let ledger = self.ledger();
        Ok(ids.iter().filter_map(|id| ledger.get(id)).collect())
    }

    /// The row of the session `id` (the ledger's, as [`SqliteStore::rows_of`]).
    pub(crate) async fn row_of(
        &self,
        _conn: &mut SqliteConnection,
        id: &str,
    ) -> Result<SessionRow, SessionError> {
        self.ledger_row(id)
    }

    /// Appends `events`, each with its session's next sequence and its
    /// shard's next position (the `events_advance_seqs` trigger moves them
    /// on); returns the sequences.
    pub(crate) async fn append_events(
        conn: &mut SqliteConnection,
        events: &[NewEvent],
        _ended: bool,
    ) -> Result<Vec<i64>, SessionError> {
        let mut seqs = Vec::with_capacity(events.len());
        for event in events {
            let seq: i64 = sqlx::query_scalar(concat!(insert_event!(), " RETURNING seq"))
                .bind(&event.session_id)
                .bind(event.kind.as_str())
                .bind(status_str(event.status))
                .bind(now_ms())
                .bind(&event.detail)
                .bind(event.bytes)
                .fetch_one(&mut *conn)
                .await?;
            seqs.push(seq);
        }
        Ok(seqs)
    }

    /// Marks a session's shard as changed by a commit that writes no event:
    /// nothing to do, as every commit here wakes every shard.
    pub(crate) async fn touch(
        _conn: &mut SqliteConnection,
        _session_id: &str,
    ) -> Result<(), SessionError> {
        Ok(())
    }

    /// Wakes the watchers after a commit (those of ends if the ledger's
    /// count of ended sessions moved; `_ended` is PostgreSQL's to say).
    pub(crate) fn committed(&self, _ended: bool) {
        self.published();
    }

    /// The writer's connection, for a write of one statement.
    pub(crate) async fn write_conn(
        &self,
    ) -> Result<MappedMutexGuard<'_, SqliteConnection>, SessionError> {
        Ok(MutexGuard::map(self.writer().await?, |w| &mut w.conn))
    }

    /// Takes the writer, first settling what a cancelled write left, and
    /// cutting the write-ahead log back if it is past its limit.
    pub(super) async fn writer(&self) -> Result<MutexGuard<'_, Writer>, SessionError> {
        let mut w = self.writer.lock().await;
        self.cut_wal_if_full().await;
        if w.open || !w.unsettled.is_empty() {
            rollback(&mut w.conn).await;
            w.open = false;
            let sql = concat!(
                "SELECT ",
                session_columns!(),
                " FROM sessions WHERE session_id = ?"
            );
            for id in w.unsettled.clone() {
                let row = sqlx::query(sql)
                    .bind(&id)
                    .fetch_optional(&mut w.conn)
                    .await?;
                if let Some((rowid, row)) = row.as_ref().map(entry_from_row).transpose()? {
                    self.ledger_mut().put(rowid, row);
                }
            }
            w.unsettled.clear();
        }
        Ok(w)
    }
}

/// Expands to the statement that appends an event at its session's next
/// sequence and its shard's next position: session, kind, status, time,
/// detail, bytes (the `events_advance_seqs` trigger moves both on); a
/// literal, so `concat!` can add a `RETURNING` at compile time.
macro_rules! insert_event {
    () => {
        "INSERT INTO events (session_id, seq, shard, shard_seq, kind, status, at_ms, detail, bytes) \
         SELECT s.session_id, s.event_seq + 1, s.shard, \
           COALESCE((SELECT seq + 1 FROM event_shards WHERE shard = s.shard), 0), \
           $2, $3, $4, $5, $6 FROM sessions s WHERE s.session_id = $1"
    };
}
pub(super) use insert_event;
