//! What creates and messages (written once, in `creates` and
//! `messages`) need of SQLite: a [`Batched`] transaction, whose
//! writes go to SQLite as one string between `BEGIN IMMEDIATE` and `COMMIT`
//! at its commit, one round trip to SQLite's worker thread in all.
//!
//! Its reads (the request id's lookup, rate state, unread bytes, group
//! members, accounts) run on the writer's connection as they come, and see
//! the database before its writes: the writer lock keeps anyone else from
//! writing in between, and the rows a rule reads come from the ledger,
//! exact under that lock. A statement of the batch is written with `$N`
//! parameters, as both dialects accept; the batch numbers them on from the
//! parameters bound before it.
//!
//! The statements that change a session's row return one integer each (a
//! new row's rowid, a message's inbox sequence), which the commit hands to
//! the ledger; the sessions they change are unsettled from before the
//! batch is sent until the ledger has them (see `writer`).

use sqlx::{
    Arguments, AssertSqlSafe, Encode, Row, Sqlite, SqliteConnection, Type,
    sqlite::{SqliteArguments, SqliteRow},
};
use tokio::sync::MutexGuard;
use troupe_proto::status::status_str;

use super::{SqliteStore, Writer, write::INSERT_ENTRY, writer::insert_event};
use crate::{
    error::SessionError,
    model::{
        Audience, AuditRecord, Idempotency, MessageRate, NewMessage, SessionId, SessionRow, Trust,
        now_ms,
    },
    {
        accounts::{INSERT_ACCOUNT, bind_account},
        creates::{INSERT_SESSION, SpawnFacts, bind_session},
        journal::{INSERT_AUDIT, NewEvent, bind_audit},
        messages::INSERT_BODY,
        shared::earlier_answer,
    },
};

/// A write whose statements are sent at once, at its commit (see the
/// module's header). Dropped before its commit, it sent nothing.
pub(crate) struct Batched<'s> {
    store: &'s SqliteStore,
    w: MutexGuard<'s, Writer>,
    batch: Batch,
    /// What each statement that returns a row returns, in order.
    returns: Vec<Returned>,
    /// A parent's spawn rate state, changed.
    spawn_tats: Vec<(SessionId, i64)>,
}

/// What a statement of the batch returns, for the ledger.
enum Returned {
    /// A new session's rowid: its row goes in the ledger.
    Inserted(Box<SessionRow>),
    /// A message's inbox sequence: the one expected.
    Sequence(String, i64),
}

impl Returned {
    fn session_id(&self) -> &str {
        match self {
            Returned::Inserted(row) => &row.session_id,
            Returned::Sequence(id, _) => id,
        }
    }
}

impl SqliteStore {
    /// Takes the writer for a [`Batched`] write.
    pub(crate) async fn batched(&self) -> Result<Batched<'_>, SessionError> {
        Ok(Batched {
            store: self,
            w: self.writer().await?,
            batch: Batch::default(),
            returns: Vec::new(),
            spawn_tats: Vec::new(),
        })
    }
}

impl Batched<'_> {
    /// The writer's connection, for reads (they see the database before
    /// this write).
    pub(crate) fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.w.conn
    }

    /// Looks up an earlier call with the same request id: its stored
    /// result if the payload matches, a conflict if not. A record made
    /// before the key's window is deleted with this write, and the call is
    /// new.
    pub(crate) async fn claim(
        &mut self,
        idem: &Idempotency,
    ) -> Result<Option<serde_json::Value>, SessionError> {
        let row: Option<(String, String, i64)> = sqlx::query_as(
            "SELECT payload_hash, result, created_at_ms FROM idempotency \
             WHERE caller = $1 AND action = $2 AND request_id = $3",
        )
        .bind(idem.caller.to_string())
        .bind(idem.action.as_str())
        .bind(&idem.request_id)
        .fetch_optional(self.conn())
        .await?;
        let Some((hash, result, created_at_ms)) = row else {
            return Ok(None);
        };
        if created_at_ms < idem.window_start_ms {
            self.batch
                .statement(
                    "DELETE FROM idempotency WHERE caller = $1 AND action = $2 AND request_id = $3",
                )
                .bind(idem.caller.to_string())
                .bind(idem.action.as_str())
                .bind(idem.request_id.clone());
            return Ok(None);
        }
        earlier_answer(idem, &hash, &result).map(Some)
    }

    /// Records the call's request id and result.
    pub(crate) async fn remember(
        &mut self,
        idem: Option<&Idempotency>,
        result: serde_json::Value,
    ) -> Result<(), SessionError> {
        let Some(idem) = idem else { return Ok(()) };
        self.batch
            .statement(
                "INSERT INTO idempotency (caller, action, request_id, payload_hash, result, \
                 created_at_ms) VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(idem.caller.to_string())
            .bind(idem.action.as_str())
            .bind(idem.request_id.clone())
            .bind(idem.payload_hash.clone())
            .bind(result.to_string())
            .bind(now_ms());
        Ok(())
    }

    pub(crate) async fn audit(&mut self, record: &AuditRecord) -> Result<(), SessionError> {
        bind_audit!(self.batch.statement(INSERT_AUDIT), record);
        Ok(())
    }

    /// Appends `events`, each at its session's next sequence and its
    /// shard's next position (the `events_advance_seqs` trigger moves them
    /// on).
    pub(crate) async fn events(&mut self, events: &[NewEvent]) -> Result<(), SessionError> {
        let at = now_ms();
        for event in events {
            self.batch
                .statement(insert_event!())
                .bind(event.session_id.clone())
                .bind(event.kind.as_str())
                .bind(status_str(event.status))
                .bind(at)
                .bind(event.detail.clone())
                .bind(event.bytes);
        }
        Ok(())
    }

    /// The workspace's active sessions, from the ledger.
    pub(crate) async fn workspace_active(
        &mut self,
        workspace_id: &str,
    ) -> Result<u32, SessionError> {
        Ok(self.store.ledger().active_in_workspace(workspace_id))
    }

    /// What a spawn's rule reads of the parent's place, from the ledger.
    pub(crate) async fn spawn_facts(
        &mut self,
        parent_id: &str,
    ) -> Result<SpawnFacts, SessionError> {
        self.store
            .ledger()
            .spawn_facts(parent_id)
            .ok_or_else(|| SessionError::not_found(parent_id))
    }

    /// Counts a new root's tree: the ledger does, from its rows.
    pub(crate) async fn count_root(
        &mut self,
        _tree_id: &str,
        _trust: Trust,
    ) -> Result<(), SessionError> {
        Ok(())
    }

    /// Sets the parent's spawn rate state to `tat_ms` (its tree and
    /// children the ledger counts from its rows).
    pub(crate) async fn count_child(
        &mut self,
        parent: &SessionRow,
        tat_ms: i64,
        _trust: Trust,
    ) -> Result<(), SessionError> {
        if tat_ms != parent.spawn_tat_ms {
            self.batch
                .statement("UPDATE sessions SET spawn_tat_ms = $1 WHERE session_id = $2")
                .bind(tat_ms)
                .bind(parent.session_id.clone());
            self.spawn_tats.push((parent.session_id.clone(), tat_ms));
        }
        Ok(())
    }

    /// Inserts a pending session's row.
    pub(crate) async fn insert_session(
        &mut self,
        row: &SessionRow,
        notify_parent: bool,
    ) -> Result<(), SessionError> {
        bind_session!(
            self.batch
                .statement(&format!("{INSERT_SESSION} RETURNING rowid")),
            row,
            notify_parent
        );
        self.returns.push(Returned::Inserted(Box::new(row.clone())));
        Ok(())
    }

    /// Inserts a new session's account.
    pub(crate) async fn account(
        &mut self,
        session_id: &str,
        depth: u32,
        limits: [Option<i64>; 4],
        deadline_ms: Option<i64>,
    ) -> Result<(), SessionError> {
        bind_account!(
            self.batch.statement(INSERT_ACCOUNT),
            session_id,
            depth,
            limits,
            deadline_ms
        );
        Ok(())
    }

    /// Stores a message's body once, under `body_id`.
    pub(crate) async fn body(&mut self, body_id: &str, body: &str) -> Result<(), SessionError> {
        self.batch
            .statement(INSERT_BODY)
            .bind(body_id.to_owned())
            .bind(body.to_owned());
        Ok(())
    }

    /// Appends `message` to `recipient`'s inbox as `sequence` (its
    /// sequence and unread bytes follow by trigger), its body the one
    /// stored under `body_id`; the commit checks that the inbox gave it.
    pub(crate) async fn entry(
        &mut self,
        recipient: &str,
        message: &NewMessage,
        body_id: &str,
        sequence: i64,
    ) -> Result<(), SessionError> {
        self.batch
            .statement(INSERT_ENTRY)
            .bind(message.message_id.clone())
            .bind(message.sender.to_string())
            .bind(body_id.to_owned())
            .bind(message.body.len() as i64)
            .bind(now_ms())
            .bind(recipient.to_owned());
        self.returns
            .push(Returned::Sequence(recipient.to_owned(), sequence));
        Ok(())
    }

    /// The sender's message rate state (zeros: it has sent nothing yet).
    pub(crate) async fn rate(&mut self, sender: &str) -> Result<MessageRate, SessionError> {
        let tats: Option<(i64, i64)> =
            sqlx::query_as("SELECT tat_ms, bytes_tat_ms FROM message_rates WHERE session_id = $1")
                .bind(sender)
                .fetch_optional(self.conn())
                .await?;
        Ok(
            tats.map_or_else(MessageRate::default, |(messages, bytes)| MessageRate {
                messages_tat_ms: messages,
                bytes_tat_ms: bytes,
            }),
        )
    }

    /// Sets the sender's rate state from `old` to `new`.
    pub(crate) async fn set_rate(
        &mut self,
        sender: &str,
        old: MessageRate,
        new: MessageRate,
    ) -> Result<(), SessionError> {
        if new != old {
            self.batch
                .statement(
                    "INSERT INTO message_rates (session_id, tat_ms, bytes_tat_ms) \
                     VALUES ($1, $2, $3) ON CONFLICT (session_id) DO UPDATE \
                     SET tat_ms = excluded.tat_ms, bytes_tat_ms = excluded.bytes_tat_ms",
                )
                .bind(sender.to_owned())
                .bind(new.messages_tat_ms)
                .bind(new.bytes_tat_ms);
        }
        Ok(())
    }

    /// The ids of the active sessions of an audience (not a group's), in
    /// the order they are answered, from the ledger.
    pub(crate) async fn audience(
        &mut self,
        audience: &Audience,
    ) -> Result<Vec<SessionId>, SessionError> {
        let ledger = self.store.ledger();
        Ok(match audience {
            Audience::Workspace(workspace_id) => {
                let (rows, _) = ledger.list(workspace_id, false, false, 0, u32::MAX);
                rows.iter().map(|row| row.session_id.clone()).collect()
            }
            Audience::Subtree(root) => {
                let mut ids = ledger.active_subtree(root);
                ids.retain(|id| id != root);
                ids
            }
            Audience::Children(parent) => ledger
                .children(parent)
                .into_iter()
                .filter(SessionRow::is_active)
                .map(|row| row.session_id)
                .collect(),
            Audience::Group { .. } => {
                return Err(SessionError::Internal(
                    "a group's members are read by the fan-out".to_owned(),
                ));
            }
        })
    }

    /// The rows of `ids` that exist, in the order of `ids`.
    pub(crate) async fn lock_rows(
        &mut self,
        ids: &[SessionId],
    ) -> Result<Vec<SessionRow>, SessionError> {
        let ledger = self.store.ledger();
        Ok(ids.iter().filter_map(|id| ledger.get(id)).collect())
    }

    /// The row of `session_id`.
    pub(crate) async fn lock_row(&mut self, session_id: &str) -> Result<SessionRow, SessionError> {
        self.store.ledger_row(session_id)
    }

    /// Clears a child's callback, due until now.
    pub(crate) async fn clear_callback(&mut self, child_id: &str) -> Result<(), SessionError> {
        self.batch
            .statement("UPDATE processes SET callback_due = FALSE WHERE session_id = $1")
            .bind(child_id.to_owned());
        Ok(())
    }

    /// Sends the batch, then puts what it changed in the ledger. On an
    /// error nothing of it stays.
    pub(crate) async fn commit(mut self) -> Result<(), SessionError> {
        let w = &mut *self.w;
        w.unsettled = self
            .returns
            .iter()
            .map(|r| r.session_id().into())
            .chain(self.spawn_tats.iter().map(|(id, _)| id.clone()))
            .collect();
        // Open until the batch's answer: dropped in between, the next
        // writer rolls back whatever SQLite has of it.
        w.open = true;
        let rows = self.batch.run(&mut w.conn).await;
        w.open = false;
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => {
                w.unsettled.clear();
                return Err(e);
            }
        };
        if rows.len() != self.returns.len() {
            return Err(SessionError::Internal(format!(
                "a batch returned {} rows where {} were expected",
                rows.len(),
                self.returns.len()
            )));
        }
        let mut ledger = self.store.ledger_mut();
        for (row, returned) in rows.iter().zip(self.returns) {
            let value: i64 = row.try_get(0)?;
            match returned {
                Returned::Inserted(session) => ledger.put(value, *session),
                Returned::Sequence(id, expected) if value == expected => {
                    ledger.update(&id, |row| row.inbox_seq = value)
                }
                Returned::Sequence(_, expected) => {
                    return Err(SessionError::Internal(format!(
                        "inbox sequence {value} stored where {expected} was expected"
                    )));
                }
            }
        }
        for (id, tat) in self.spawn_tats {
            ledger.update(&id, |row| row.spawn_tat_ms = tat);
        }
        drop(ledger);
        w.unsettled.clear();
        Ok(())
    }
}

/// Statements sent as one string, their `$N` parameters numbered on across
/// the batch.
#[derive(Default)]
struct Batch {
    sql: String,
    args: SqliteArguments,
    bound: usize,
}

impl Batch {
    /// Appends a statement (without its `;`), its `$N` parameters those
    /// bound after it.
    fn statement(&mut self, sql: &str) -> &mut Batch {
        let mut rest = sql;
        while let Some(at) = rest.find('$') {
            self.sql.push_str(&rest[..=at]);
            rest = &rest[at + 1..];
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            let n: usize = rest[..digits].parse().unwrap_or(0);
            self.sql.push_str(&(n + self.bound).to_string());
            rest = &rest[digits..];
        }
        self.sql.push_str(rest);
        self.sql.push_str(";\n");
        self
    }

    /// Binds the next parameter of the batch.
    fn bind<'a, T: Encode<'a, Sqlite> + Type<Sqlite> + 'a>(&mut self, value: T) -> &mut Batch {
        // Binding only fails for a value that cannot encode; ours are plain
        // integers and strings, and a failure surfaces when the batch runs.
        let _ = self.args.add(value);
        self.bound += 1;
        self
    }

    /// Runs the batch as one transaction; returns the rows its statements
    /// returned. On an error nothing of it stays: it is rolled back.
    async fn run(self, conn: &mut SqliteConnection) -> Result<Vec<SqliteRow>, SessionError> {
        let sql = format!("BEGIN IMMEDIATE;\n{}COMMIT;", self.sql);
        match sqlx::query_with(AssertSqlSafe(sql), self.args)
            .fetch_all(&mut *conn)
            .await
        {
            Ok(rows) => Ok(rows),
            Err(e) => {
                super::write::rollback(conn).await;
                Err(e.into())
            }
        }
    }
}
