//! The statements the store's write paths are made of, and the two ways
//! they reach SQLite:
//!
//! - [`Batch`]: statements sent as one string between `BEGIN IMMEDIATE` and
//!   `COMMIT`, one round trip to SQLite's worker thread in all. The hot
//!   writes (create, message) are one batch: their checks read the
//!   in-memory [`Ledger`](super::ledger::Ledger), not the database.
//! - [`Write`]: an ordinary transaction, a round trip per statement, for the
//!   writes whose later statements depend on what earlier ones returned.
//!
//! Sequence counters advance by trigger (see the migrations); every event,
//! the created and message ones included, is a statement of the write that
//! causes it. Changed session rows come back through `RETURNING`, for the
//! ledger.

use sqlx::{
    Arguments, AssertSqlSafe, Encode, Row, Sqlite, SqliteConnection, Transaction, Type,
    sqlite::{SqliteArguments, SqliteRow},
};

use super::open::RawSession;
use crate::{
    error::{Reason, SessionError},
    model::{
        AuditRecord, EventDetail, EventKind, Idempotency, MessageRate, NewMessage, NewSession,
        SessionRow, now_ms,
    },
    store::{
        journal::{created_detail, message_detail},
        lease::PRUNED_ACTIONS,
    },
};

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

/// Statements run as one transaction in one round trip. Each statement uses
/// anonymous `?` parameters only, bound in order across the whole batch.
pub(super) struct Batch {
    sql: String,
    args: SqliteArguments,
}

impl Batch {
    /// A batch that opens its own transaction.
    pub fn new() -> Batch {
        Batch {
            sql: "BEGIN IMMEDIATE;\n".to_owned(),
            args: SqliteArguments::default(),
        }
    }

    /// A batch that goes on with the transaction already open on its
    /// connection, and commits it.
    pub fn within() -> Batch {
        Batch {
            sql: String::new(),
            args: SqliteArguments::default(),
        }
    }

    /// Appends a statement (without its `;`).
    pub fn statement(&mut self, sql: &str) -> &mut Batch {
        self.sql.push_str(sql);
        self.sql.push_str(";\n");
        self
    }

    /// Binds the next `?` of the batch.
    pub fn bind<'a, T: Encode<'a, Sqlite> + Type<Sqlite> + 'a>(&mut self, value: T) -> &mut Batch {
        // Binding only fails for a value that cannot encode; ours are plain
        // integers and strings, and a failure surfaces when the batch runs.
        let _ = self.args.add(value);
        self
    }

    /// Runs the batch and commits; returns the rows its statements returned.
    /// On an error nothing of it stays: the transaction is rolled back.
    pub async fn run(
        mut self,
        conn: &mut SqliteConnection,
    ) -> Result<Vec<SqliteRow>, SessionError> {
        self.sql.push_str("COMMIT;");
        let result = sqlx::query_with(AssertSqlSafe(self.sql), self.args)
            .fetch_all(&mut *conn)
            .await;
        match result {
            Ok(rows) => Ok(rows),
            Err(e) => {
                rollback(conn).await;
                Err(e.into())
            }
        }
    }

    /// Inserts the idempotency record of a call that carried a request id.
    pub fn remember(
        &mut self,
        idem: Option<&Idempotency>,
        result: serde_json::Value,
    ) -> &mut Batch {
        let Some(idem) = idem else { return self };
        self.statement(
            "INSERT INTO idempotency (caller, action, request_id, payload_hash, result, created_at_ms) \
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(idem.caller.to_string())
        .bind(idem.action.as_str())
        .bind(idem.request_id.clone())
        .bind(idem.payload_hash.clone())
        .bind(result.to_string())
        .bind(now_ms())
    }

    /// Inserts a pending session, its created event and its initial message;
    /// the session and the message return their rows, the session's first.
    pub fn insert_session(
        &mut self,
        new: &NewSession,
        parent: Option<&SessionRow>,
        tree_id: &str,
        depth: u32,
    ) -> &mut Batch {
        let at = now_ms();
        self.statement(concat!(
            "INSERT INTO sessions (session_id, workspace_id, parent_session_id, parent_trust_level, \
             tree_id, depth, trust_level, agent_name, agent_command, title, status, created_by, \
             created_at_ms, traceparent, spawn_span_id, notify_parent, writable_paths, on_parent_end) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?) RETURNING ",
            session_columns!()
        ))
        .bind(new.session_id.clone())
        .bind(new.workspace_id.clone())
        .bind(parent.map(|p| p.session_id.clone()))
        .bind(parent.map(|p| p.trust.as_str()))
        .bind(tree_id.to_owned())
        .bind(i64::from(depth))
        .bind(new.trust.as_str())
        .bind(new.agent_name.clone())
        .bind(new.agent_command.clone())
        .bind(new.title.clone())
        .bind(new.created_by.to_string())
        .bind(at)
        .bind(new.trace.map(|t| t.traceparent()))
        .bind(new.trace.map(|t| t.spawn_span_id.to_string()))
        .bind(new.notify_parent)
        .bind(crate::store::scope_text(&new.write_scope))
        .bind(new.on_parent_end.as_str());
        self.event(
            &new.session_id,
            EventKind::Created,
            at,
            created_detail(&new.agent_name, &new.title),
        );
        if let Some(message) = &new.initial_message {
            self.message(&new.session_id, message, 1);
        }
        self
    }

    /// Appends an event of `kind` to a session's, at its next sequence and
    /// with its status as the transaction has it.
    pub fn event(
        &mut self,
        session_id: &str,
        kind: EventKind,
        at_ms: i64,
        detail: EventDetail,
    ) -> &mut Batch {
        self.statement(
            "INSERT INTO events (session_id, seq, kind, status, at_ms, detail) \
             SELECT session_id, event_seq + 1, ?, status, ?, ? FROM sessions WHERE session_id = ?",
        )
        .bind(kind.as_str())
        .bind(at_ms)
        .bind(detail.to_json())
        .bind(session_id.to_owned())
    }

    /// Appends a message to one inbox as its `sequence`, its body stored
    /// with it; returns its `seq`.
    pub fn message(&mut self, recipient: &str, message: &NewMessage, sequence: u64) -> &mut Batch {
        self.body(&message.message_id, &message.body).entry(
            recipient,
            message,
            &message.message_id,
            sequence,
        )
    }

    /// Stores a message's body once, under `body_id`.
    pub fn body(&mut self, body_id: &str, body: &str) -> &mut Batch {
        self.statement(INSERT_BODY)
            .bind(body_id.to_owned())
            .bind(body.to_owned())
    }

    /// Appends `message` to an inbox as its `sequence` (the one the ledger
    /// expects: the caller checks the `seq` returned), its body the one
    /// stored under `body_id`, and its event (the inbox's sequence and
    /// unread bytes follow by trigger); returns its `seq`.
    pub fn entry(
        &mut self,
        recipient: &str,
        message: &NewMessage,
        body_id: &str,
        sequence: u64,
    ) -> &mut Batch {
        let at = now_ms();
        self.statement(INSERT_ENTRY)
            .bind(message.message_id.clone())
            .bind(message.sender.to_string())
            .bind(body_id.to_owned())
            .bind(message.body.len() as i64)
            .bind(at)
            .bind(recipient.to_owned());
        self.event(
            recipient,
            EventKind::Message,
            at,
            message_detail(&message.message_id, sequence as i64, message.body.len()),
        )
    }

    /// Inserts a new session's account: its budget's limits (as stored,
    /// `store::accounts::stored_budget`) and its deadline.
    pub fn account(
        &mut self,
        session_id: &str,
        depth: u32,
        limits: [Option<i64>; 4],
        deadline_ms: Option<i64>,
    ) -> &mut Batch {
        let [cost, tokens, calls, wall] = limits;
        self.statement(
            "INSERT INTO accounts (session_id, depth, cost_limit, tokens_limit, calls_limit,              wall_ms, deadline_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(session_id.to_owned())
        .bind(i64::from(depth))
        .bind(cost)
        .bind(tokens)
        .bind(calls)
        .bind(wall)
        .bind(deadline_ms)
    }

    pub fn set_spawn_tat(&mut self, session_id: &str, tat_ms: i64) -> &mut Batch {
        self.statement("UPDATE sessions SET spawn_tat_ms = ? WHERE session_id = ?")
            .bind(tat_ms)
            .bind(session_id.to_owned())
    }

    /// Sets a session's message rate state.
    pub fn set_message_rate(&mut self, session_id: &str, rate: MessageRate) -> &mut Batch {
        self.statement(
            "INSERT INTO message_rates (session_id, tat_ms, bytes_tat_ms) VALUES (?, ?, ?) \
             ON CONFLICT (session_id) DO UPDATE \
             SET tat_ms = excluded.tat_ms, bytes_tat_ms = excluded.bytes_tat_ms",
        )
        .bind(session_id.to_owned())
        .bind(rate.messages_tat_ms)
        .bind(rate.bytes_tat_ms)
    }

    pub fn audit(&mut self, record: &AuditRecord) -> &mut Batch {
        self.statement(INSERT_AUDIT)
            .bind(now_ms())
            .bind(record.caller.to_string())
            .bind(record.action.as_str())
            .bind(record.target.clone())
            .bind(record.allowed)
            .bind(record.reason.clone())
            .bind(record.detail.clone())
    }
}

/// Ends whatever transaction a failed or cancelled write left open ("no
/// transaction is active" when there is none, which is fine).
pub(super) async fn rollback(conn: &mut SqliteConnection) {
    let _ = sqlx::query("ROLLBACK").execute(conn).await;
}

/// Looks up an earlier call with the same key: its stored result if the
/// payload matches, a conflict if it does not. A record made before the
/// key's window has expired: it is deleted, and the call is new.
pub(super) async fn replay(
    conn: &mut SqliteConnection,
    idem: &Idempotency,
) -> Result<Option<serde_json::Value>, SessionError> {
    let row = sqlx::query(
        "SELECT payload_hash, result, created_at_ms FROM idempotency \
         WHERE caller = ? AND action = ? AND request_id = ?",
    )
    .bind(idem.caller.to_string())
    .bind(idem.action.as_str())
    .bind(&idem.request_id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let created_at_ms: i64 = row.try_get("created_at_ms")?;
    if created_at_ms < idem.window_start_ms {
        sqlx::query("DELETE FROM idempotency WHERE caller = ? AND action = ? AND request_id = ?")
            .bind(idem.caller.to_string())
            .bind(idem.action.as_str())
            .bind(&idem.request_id)
            .execute(conn)
            .await?;
        return Ok(None);
    }
    let hash: String = row.try_get("payload_hash")?;
    if hash != idem.payload_hash {
        return Err(SessionError::refused(
            Reason::IdempotencyConflict,
            format!(
                "request_id {:?} was already used with a different payload",
                idem.request_id
            ),
        ));
    }
    let result: String = row.try_get("result")?;
    serde_json::from_str(&result)
        .map(Some)
        .map_err(|e| SessionError::Internal(format!("bad idempotency record: {e}")))
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

    /// Deletes all but the newest `keep` events; returns the highest id pruned so far.
    pub async fn prune_events(&mut self, keep: u64) -> Result<i64, SessionError> {
        let through: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) - ? FROM events")
            .bind(keep.min(i64::MAX as u64) as i64)
            .fetch_one(&mut *self.tx)
            .await?;
        super::output::forget_pruned(&mut self.tx, through).await?;
        sqlx::query("DELETE FROM events WHERE id <= ?")
            .bind(through)
            .execute(&mut *self.tx)
            .await?;
        Ok(sqlx::query_scalar(
            "UPDATE meta SET value = MAX(value, ?) WHERE key = 'events_pruned_through' RETURNING value",
        )
        .bind(through)
        .fetch_one(&mut *self.tx)
        .await?)
    }
}

/// The audit insert, its values in [`AuditRecord`]'s order after the time.
/// Stores a body: its id, its text.
/// (Plain `?`s, bound in order: a [`Batch`] numbers its parameters across
/// its statements.)
pub(super) const INSERT_BODY: &str = "INSERT INTO message_bodies (body_id, body) VALUES (?, ?)";
/// Appends an inbox entry: message id, sender, body id, bytes, time,
/// recipient; returns its `seq`. The body's text stays in `message_bodies`.
pub(super) const INSERT_ENTRY: &str = "INSERT INTO messages (message_id, session_id, seq, sender, body, body_id, bytes, \
     created_at_ms) \
     SELECT ?, session_id, inbox_seq + 1, ?, '', ?, ?, ? FROM sessions WHERE session_id = ? \
     RETURNING seq";

const INSERT_AUDIT: &str = "INSERT INTO audit (at_ms, caller, action, target, allowed, reason, detail) \
     VALUES (?, ?, ?, ?, ?, ?, ?)";
