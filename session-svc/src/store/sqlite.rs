//! [`SqliteStore`]: the embedded store. WAL journal, migrations at open, and
//! every check-then-write in a `BEGIN IMMEDIATE` transaction, which takes the
//! database's write lock up front so checks and writes are serialised.

use std::{str::FromStr, time::Duration};

use serde_json::json;
use sqlx::{
    Row, Sqlite, SqlitePool, Transaction,
    sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
    },
};
use tokio::sync::watch;
use troupe_proto::status::{parse_status, status_str};

use super::{Created, EventPage, MessageCheck, RootCheck, Sent, SpawnCheck, Store, TerminateCheck};
use crate::{
    error::{QuotaLeft, SessionError},
    model::{
        AuditRecord, AuditRow, EventFilter, EventRow, Idempotency, NewMessage, NewSession,
        SessionRow, Trust, now_ms,
    },
    policy::SpawnContext,
};

/// Expands to the columns [`session_from_row`] reads, for `concat!`.
macro_rules! session_columns {
    () => {
        "rowid, session_id, workspace_id, parent_session_id, parent_trust_level, tree_id, depth, \
         trust_level, agent_name, agent_command, title, status, created_by, created_at_ms, \
         ended_at_ms, end_reason, spawn_tat_ms, inbox_seq"
    };
}

/// The SQLite store.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    newest_event: watch::Sender<i64>,
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `url` and runs the migrations.
    pub async fn open(url: &str) -> Result<Self, SessionError> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations/sqlite")
            .run(&pool)
            .await
            .map_err(|e| SessionError::Internal(format!("migration failed: {e}")))?;
        let newest: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM events")
            .fetch_one(&pool)
            .await?;
        let (newest_event, _) = watch::channel(newest);
        Ok(SqliteStore { pool, newest_event })
    }

    async fn begin(&self) -> Result<Transaction<'static, Sqlite>, SessionError> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// Commits and tells watchers about the newest event.
    async fn commit(&self, tx: Transaction<'static, Sqlite>) -> Result<(), SessionError> {
        tx.commit().await?;
        let newest: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM events")
            .fetch_one(&self.pool)
            .await?;
        self.newest_event.send_if_modified(|current| {
            if newest > *current {
                *current = newest;
                true
            } else {
                false
            }
        });
        Ok(())
    }
}

fn session_from_row(row: &SqliteRow) -> Result<SessionRow, SessionError> {
    use sqlx::FromRow;
    RawSession::from_row(row)?.into_row()
}

/// A session row as stored: read from SQL rows, and from the JSON objects
/// of `list_workspace`'s pages.
#[derive(serde::Deserialize, sqlx::FromRow)]
struct RawSession {
    rowid: i64,
    session_id: String,
    workspace_id: String,
    parent_session_id: Option<String>,
    parent_trust_level: Option<String>,
    tree_id: String,
    depth: u32,
    trust_level: String,
    agent_name: String,
    agent_command: String,
    title: String,
    status: String,
    created_by: String,
    created_at_ms: i64,
    ended_at_ms: Option<i64>,
    end_reason: Option<String>,
    spawn_tat_ms: i64,
    inbox_seq: i64,
}

impl RawSession {
    fn into_row(self) -> Result<SessionRow, SessionError> {
        Ok(SessionRow {
            trust: Trust::from_db(&self.trust_level).ok_or_else(|| {
                SessionError::Internal(format!("bad trust level {:?}", self.trust_level))
            })?,
            status: parse_status(&self.status)
                .ok_or_else(|| SessionError::Internal(format!("bad status {:?}", self.status)))?,
            parent_trust: self.parent_trust_level.as_deref().and_then(Trust::from_db),
            session_id: self.session_id,
            workspace_id: self.workspace_id,
            parent_session_id: self.parent_session_id,
            tree_id: self.tree_id,
            depth: self.depth,
            agent_name: self.agent_name,
            agent_command: self.agent_command,
            title: self.title,
            created_by: self.created_by,
            created_at_ms: self.created_at_ms,
            ended_at_ms: self.ended_at_ms,
            end_reason: self.end_reason,
            spawn_tat_ms: self.spawn_tat_ms,
            inbox_seq: self.inbox_seq,
        })
    }
}

async fn fetch_session(
    tx: &mut Transaction<'static, Sqlite>,
    session_id: &str,
) -> Result<Option<SessionRow>, SessionError> {
    let sql = concat!(
        "SELECT ",
        session_columns!(),
        " FROM sessions WHERE session_id = ?"
    );
    let row = sqlx::query(sql)
        .bind(session_id)
        .fetch_optional(&mut **tx)
        .await?;
    row.as_ref().map(session_from_row).transpose()
}

async fn count(
    tx: &mut Transaction<'static, Sqlite>,
    sql: &'static str,
    arg: &str,
) -> Result<u32, SessionError> {
    let n: i64 = sqlx::query_scalar(sql)
        .bind(arg)
        .fetch_one(&mut **tx)
        .await?;
    Ok(n as u32)
}

async fn insert_event(
    tx: &mut Transaction<'static, Sqlite>,
    session_id: &str,
    kind: &str,
    status: &str,
    detail: serde_json::Value,
) -> Result<(), SessionError> {
    let seq: i64 = sqlx::query_scalar(
        "UPDATE sessions SET event_seq = event_seq + 1 WHERE session_id = ? RETURNING event_seq",
    )
    .bind(session_id)
    .fetch_one(&mut **tx)
    .await?;
    sqlx::query(
        "INSERT INTO events (session_id, seq, kind, status, at_ms, detail) VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(session_id)
    .bind(seq)
    .bind(kind)
    .bind(status)
    .bind(now_ms())
    .bind(detail.to_string())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn insert_audit(
    tx: &mut Transaction<'static, Sqlite>,
    record: &AuditRecord,
) -> Result<(), SessionError> {
    sqlx::query(
        "INSERT INTO audit (at_ms, caller, action, target, allowed, reason, detail) \
         VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(now_ms())
    .bind(&record.caller)
    .bind(record.action)
    .bind(&record.target)
    .bind(record.allowed)
    .bind(&record.reason)
    .bind(&record.detail)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Looks up an earlier call with the same key: its stored result if the
/// payload matches, a conflict if it does not.
async fn replay(
    tx: &mut Transaction<'static, Sqlite>,
    idem: Option<&Idempotency>,
) -> Result<Option<serde_json::Value>, SessionError> {
    let Some(idem) = idem else { return Ok(None) };
    let row = sqlx::query(
        "SELECT payload_hash, result FROM idempotency WHERE caller = ? AND action = ? AND request_id = ?",
    )
    .bind(&idem.caller)
    .bind(idem.action)
    .bind(&idem.request_id)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let hash: String = row.try_get("payload_hash")?;
    if hash != idem.payload_hash {
        return Err(SessionError::refused(
            crate::error::Reason::IdempotencyConflict,
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

async fn remember(
    tx: &mut Transaction<'static, Sqlite>,
    idem: Option<&Idempotency>,
    result: serde_json::Value,
) -> Result<(), SessionError> {
    let Some(idem) = idem else { return Ok(()) };
    sqlx::query(
        "INSERT INTO idempotency (caller, action, request_id, payload_hash, result, created_at_ms) \
         VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(&idem.caller)
    .bind(idem.action)
    .bind(&idem.request_id)
    .bind(&idem.payload_hash)
    .bind(result.to_string())
    .bind(now_ms())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

fn quota_json(q: &QuotaLeft) -> serde_json::Value {
    json!([
        q.tree_sessions_remaining,
        q.depth_remaining,
        q.children_remaining
    ])
}

fn replayed_create(result: serde_json::Value) -> Result<Created, SessionError> {
    let bad = || SessionError::Internal("bad idempotency record".to_owned());
    let session_id = result["session_id"].as_str().ok_or_else(bad)?.to_owned();
    let q = |i: usize| {
        result["quota"][i]
            .as_u64()
            .map(|v| v as u32)
            .ok_or_else(bad)
    };
    Ok(Created::Replayed {
        session_id,
        quota: QuotaLeft {
            tree_sessions_remaining: q(0)?,
            depth_remaining: q(1)?,
            children_remaining: q(2)?,
        },
    })
}

/// Inserts a session row, its created event, and its initial message.
async fn insert_session(
    tx: &mut Transaction<'static, Sqlite>,
    new: &NewSession,
    parent: Option<&SessionRow>,
    tree_id: &str,
    depth: u32,
) -> Result<SessionRow, SessionError> {
    let now = now_ms();
    sqlx::query(
        "INSERT INTO sessions (session_id, workspace_id, parent_session_id, parent_trust_level, \
         tree_id, depth, trust_level, agent_name, agent_command, title, status, created_by, \
         created_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?)",
    )
    .bind(&new.session_id)
    .bind(&new.workspace_id)
    .bind(parent.map(|p| p.session_id.as_str()))
    .bind(parent.map(|p| p.trust.as_str()))
    .bind(tree_id)
    .bind(i64::from(depth))
    .bind(new.trust.as_str())
    .bind(&new.agent_name)
    .bind(&new.agent_command)
    .bind(&new.title)
    .bind(&new.created_by)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    insert_event(
        tx,
        &new.session_id,
        "created",
        "pending",
        json!({"agent_name": new.agent_name, "title": new.title}),
    )
    .await?;
    if let Some(message) = &new.initial_message {
        insert_message(tx, &new.session_id, "pending", message).await?;
    }
    fetch_session(tx, &new.session_id)
        .await?
        .ok_or_else(|| SessionError::Internal("inserted session vanished".to_owned()))
}

async fn insert_message(
    tx: &mut Transaction<'static, Sqlite>,
    recipient: &str,
    recipient_status: &str,
    message: &NewMessage,
) -> Result<u64, SessionError> {
    let seq: i64 = sqlx::query_scalar(
        "UPDATE sessions SET inbox_seq = inbox_seq + 1 WHERE session_id = ? RETURNING inbox_seq",
    )
    .bind(recipient)
    .fetch_one(&mut **tx)
    .await?;
    sqlx::query(
        "INSERT INTO messages (message_id, session_id, seq, sender, body, created_at_ms) \
         VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(&message.message_id)
    .bind(recipient)
    .bind(seq)
    .bind(&message.sender)
    .bind(&message.body)
    .bind(now_ms())
    .execute(&mut **tx)
    .await?;
    insert_event(
        tx,
        recipient,
        "message",
        recipient_status,
        json!({
            "message_id": message.message_id,
            "inbox_sequence": seq,
            "bytes": message.body.len(),
        }),
    )
    .await?;
    Ok(seq as u64)
}

impl Store for SqliteStore {
    async fn create_root(
        &self,
        new: NewSession,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        check: RootCheck<'_>,
    ) -> Result<Created, SessionError> {
        let mut tx = self.begin().await?;
        if let Some(result) = replay(&mut tx, idem.as_ref()).await? {
            return replayed_create(result);
        }
        let active = count(
            &mut tx,
            "SELECT COUNT(*) FROM sessions WHERE workspace_id = ? AND status IN ('pending', 'running')",
            &new.workspace_id,
        )
        .await?;
        let quota = check(active)?;
        let tree_id = format!("tree_{}", uuid::Uuid::now_v7().simple());
        let session = insert_session(&mut tx, &new, None, &tree_id, 0).await?;
        insert_audit(&mut tx, &audit).await?;
        remember(
            &mut tx,
            idem.as_ref(),
            json!({"session_id": session.session_id, "quota": quota_json(&quota)}),
        )
        .await?;
        self.commit(tx).await?;
        Ok(Created::New {
            session: Box::new(session),
            quota,
        })
    }

    async fn create_child(
        &self,
        parent_id: &str,
        new: NewSession,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        check: SpawnCheck<'_>,
    ) -> Result<Created, SessionError> {
        let mut tx = self.begin().await?;
        if let Some(result) = replay(&mut tx, idem.as_ref()).await? {
            return replayed_create(result);
        }
        let parent = fetch_session(&mut tx, parent_id)
            .await?
            .ok_or_else(|| SessionError::not_found(parent_id))?;
        let (tree_sessions, children, workspace_active): (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT COUNT(*) FROM sessions WHERE tree_id = ?1), \
                    (SELECT COUNT(*) FROM sessions WHERE parent_session_id = ?2), \
                    (SELECT COUNT(*) FROM sessions WHERE workspace_id = ?3 \
                       AND status IN ('pending', 'running'))",
        )
        .bind(&parent.tree_id)
        .bind(&parent.session_id)
        .bind(&parent.workspace_id)
        .fetch_one(&mut *tx)
        .await?;
        let ctx = SpawnContext {
            parent: &parent,
            tree_sessions: tree_sessions as u32,
            children: children as u32,
            workspace_active: workspace_active as u32,
            now_ms: now_ms(),
        };
        let admission = check(&ctx)?;
        sqlx::query("UPDATE sessions SET spawn_tat_ms = ? WHERE session_id = ?")
            .bind(admission.parent_spawn_tat_ms)
            .bind(&parent.session_id)
            .execute(&mut *tx)
            .await?;
        let session = insert_session(
            &mut tx,
            &new,
            Some(&parent),
            &parent.tree_id,
            admission.depth,
        )
        .await?;
        insert_audit(&mut tx, &audit).await?;
        remember(
            &mut tx,
            idem.as_ref(),
            json!({"session_id": session.session_id, "quota": quota_json(&admission.quota)}),
        )
        .await?;
        self.commit(tx).await?;
        Ok(Created::New {
            session: Box::new(session),
            quota: admission.quota,
        })
    }

    async fn send_message(
        &self,
        recipient: &str,
        message: NewMessage,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        check: MessageCheck<'_>,
    ) -> Result<Sent, SessionError> {
        let mut tx = self.begin().await?;
        if let Some(result) = replay(&mut tx, idem.as_ref()).await? {
            let bad = || SessionError::Internal("bad idempotency record".to_owned());
            return Ok(Sent {
                message_id: result["message_id"].as_str().ok_or_else(bad)?.to_owned(),
                sequence: result["sequence"].as_u64().ok_or_else(bad)?,
                replayed: true,
            });
        }
        let target = fetch_session(&mut tx, recipient)
            .await?
            .ok_or_else(|| SessionError::not_found(recipient))?;
        check(&target)?;
        let sequence =
            insert_message(&mut tx, recipient, status_str(target.status), &message).await?;
        insert_audit(&mut tx, &audit).await?;
        remember(
            &mut tx,
            idem.as_ref(),
            json!({"message_id": message.message_id, "sequence": sequence}),
        )
        .await?;
        self.commit(tx).await?;
        Ok(Sent {
            message_id: message.message_id,
            sequence,
            replayed: false,
        })
    }

    async fn terminate(
        &self,
        target: &str,
        terminated_by: &str,
        reason: &str,
        audit: AuditRecord,
        check: TerminateCheck<'_>,
    ) -> Result<(Vec<String>, SessionRow), SessionError> {
        let mut tx = self.begin().await?;
        let row = fetch_session(&mut tx, target)
            .await?
            .ok_or_else(|| SessionError::not_found(target))?;
        let ancestors: Vec<String> = sqlx::query_scalar(
            "WITH RECURSIVE anc(id, parent, n) AS ( \
               SELECT session_id, parent_session_id, 0 FROM sessions WHERE session_id = ? \
               UNION ALL \
               SELECT s.session_id, s.parent_session_id, anc.n + 1 \
               FROM sessions s JOIN anc ON s.session_id = anc.parent) \
             SELECT id FROM anc WHERE n > 0 ORDER BY n",
        )
        .bind(target)
        .fetch_all(&mut *tx)
        .await?;
        check(&row, &ancestors)?;
        let subtree: Vec<(String, String)> = sqlx::query_as(
            "WITH RECURSIVE sub(id, n) AS ( \
               SELECT ?, 0 \
               UNION ALL \
               SELECT s.session_id, sub.n + 1 FROM sessions s JOIN sub ON s.parent_session_id = sub.id) \
             SELECT s.session_id, s.status FROM sessions s JOIN sub ON s.session_id = sub.id \
             ORDER BY sub.n, s.created_at_ms",
        )
        .bind(target)
        .fetch_all(&mut *tx)
        .await?;
        let now = now_ms();
        let mut ended = Vec::new();
        for (id, status) in subtree {
            if !matches!(status.as_str(), "pending" | "running") {
                continue;
            }
            let why = if id == target { reason } else { "cascade" };
            sqlx::query(
                "UPDATE sessions SET status = 'terminated', ended_at_ms = ?, end_reason = ? \
                 WHERE session_id = ?",
            )
            .bind(now)
            .bind(why)
            .bind(&id)
            .execute(&mut *tx)
            .await?;
            insert_event(
                &mut tx,
                &id,
                "terminated",
                "terminated",
                json!({"reason": why, "terminated_by": terminated_by}),
            )
            .await?;
            ended.push(id);
        }
        let mut audit = audit;
        audit.detail = json!({"terminated": ended}).to_string();
        insert_audit(&mut tx, &audit).await?;
        let row = fetch_session(&mut tx, target)
            .await?
            .ok_or_else(|| SessionError::not_found(target))?;
        self.commit(tx).await?;
        Ok((ended, row))
    }

    async fn get_session(&self, session_id: &str) -> Result<Option<SessionRow>, SessionError> {
        let sql = concat!(
            "SELECT ",
            session_columns!(),
            " FROM sessions WHERE session_id = ?"
        );
        let row = sqlx::query(sql)
            .bind(session_id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(session_from_row).transpose()
    }

    async fn children(&self, session_id: &str) -> Result<Vec<SessionRow>, SessionError> {
        let sql = concat!(
            "SELECT ",
            session_columns!(),
            " FROM sessions WHERE parent_session_id = ? ORDER BY rowid"
        );
        let rows = sqlx::query(sql)
            .bind(session_id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(session_from_row).collect()
    }

    async fn inbox_count(&self, session_id: &str) -> Result<u64, SessionError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages WHERE session_id = ?")
            .bind(session_id)
            .fetch_one(&self.pool)
            .await?;
        Ok(n as u64)
    }

    async fn list_workspace(
        &self,
        workspace_id: &str,
        sandboxed_only: bool,
        include_ended: bool,
        after: i64,
        limit: u32,
    ) -> Result<(Vec<SessionRow>, Option<i64>), SessionError> {
        // The page comes back as one JSON value: one row crossing from the
        // SQLite worker thread instead of one per session.
        let page: String = sqlx::query_scalar(
            "SELECT json_group_array(json_object( \
               'rowid', rowid, 'session_id', session_id, 'workspace_id', workspace_id, \
               'parent_session_id', parent_session_id, 'parent_trust_level', parent_trust_level, \
               'tree_id', tree_id, 'depth', depth, 'trust_level', trust_level, \
               'agent_name', agent_name, 'agent_command', agent_command, 'title', title, \
               'status', status, 'created_by', created_by, 'created_at_ms', created_at_ms, \
               'ended_at_ms', ended_at_ms, 'end_reason', end_reason, \
               'spawn_tat_ms', spawn_tat_ms, 'inbox_seq', inbox_seq)) \
             FROM (SELECT rowid, * FROM sessions WHERE workspace_id = ? AND rowid > ? \
                   AND (? = 0 OR trust_level = 'sandboxed') \
                   AND (? = 1 OR status IN ('pending', 'running')) \
                   ORDER BY rowid LIMIT ?)",
        )
        .bind(workspace_id)
        .bind(after)
        .bind(sandboxed_only)
        .bind(include_ended)
        .bind(i64::from(limit) + 1)
        .fetch_one(&self.pool)
        .await?;
        let raw: Vec<RawSession> = serde_json::from_str(&page)
            .map_err(|e| SessionError::Internal(format!("bad session page: {e}")))?;
        let more = raw.len() > limit as usize;
        let mut sessions = Vec::with_capacity(raw.len().min(limit as usize));
        let mut last = after;
        for row in raw.into_iter().take(limit as usize) {
            last = row.rowid;
            sessions.push(row.into_row()?);
        }
        Ok((sessions, more.then_some(last)))
    }

    async fn events_after(
        &self,
        filter: &EventFilter,
        after: i64,
        limit: u32,
    ) -> Result<EventPage, SessionError> {
        // One read transaction: the pruning mark and the page come from the same snapshot.
        let mut tx = self.pool.begin().await?;
        let pruned: i64 =
            sqlx::query_scalar("SELECT value FROM meta WHERE key = 'events_pruned_through'")
                .fetch_one(&mut *tx)
                .await?;
        if after > 0 && after < pruned {
            return Ok(EventPage::Expired {
                pruned_through: pruned,
            });
        }
        let rows = sqlx::query(
            "SELECT e.id, e.seq, e.kind, e.status, e.at_ms, e.detail, e.session_id, \
               s.workspace_id, s.parent_session_id, s.parent_trust_level, s.tree_id, s.depth, \
               s.trust_level \
             FROM events e JOIN sessions s ON s.session_id = e.session_id \
             WHERE e.id > ? \
               AND (?2 IS NULL OR e.session_id = ?2) \
               AND (?3 IS NULL OR s.tree_id = ?3) \
               AND (?4 IS NULL OR s.workspace_id = ?4) \
               AND (?5 = 0 OR s.trust_level = 'sandboxed') \
             ORDER BY e.id LIMIT ?6",
        )
        .bind(after)
        .bind(filter.session_id.as_deref())
        .bind(filter.tree_id.as_deref())
        .bind(filter.workspace_id.as_deref())
        .bind(filter.sandboxed_only)
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let mut events = Vec::with_capacity(rows.len());
        for row in &rows {
            let trust: String = row.try_get("trust_level")?;
            let parent_trust: Option<String> = row.try_get("parent_trust_level")?;
            let depth: i64 = row.try_get("depth")?;
            events.push(EventRow {
                id: row.try_get("id")?,
                seq: row.try_get("seq")?,
                kind: row.try_get("kind")?,
                status: row.try_get("status")?,
                at_ms: row.try_get("at_ms")?,
                detail: row.try_get("detail")?,
                session_id: row.try_get("session_id")?,
                workspace_id: row.try_get("workspace_id")?,
                parent_session_id: row.try_get("parent_session_id")?,
                parent_trust: parent_trust.as_deref().and_then(Trust::from_db),
                tree_id: row.try_get("tree_id")?,
                depth: depth as u32,
                trust: Trust::from_db(&trust)
                    .ok_or_else(|| SessionError::Internal(format!("bad trust level {trust:?}")))?,
            });
        }
        Ok(EventPage::Events(events))
    }

    async fn prune_events(&self, keep: u64) -> Result<i64, SessionError> {
        let mut tx = self.begin().await?;
        let newest: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM events")
            .fetch_one(&mut *tx)
            .await?;
        let through = newest - keep.min(i64::MAX as u64) as i64;
        let pruned: i64 =
            sqlx::query_scalar("SELECT value FROM meta WHERE key = 'events_pruned_through'")
                .fetch_one(&mut *tx)
                .await?;
        if through > pruned {
            sqlx::query("DELETE FROM events WHERE id <= ?")
                .bind(through)
                .execute(&mut *tx)
                .await?;
            sqlx::query("UPDATE meta SET value = ? WHERE key = 'events_pruned_through'")
                .bind(through)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            return Ok(through);
        }
        tx.commit().await?;
        Ok(pruned)
    }

    fn subscribe(&self) -> watch::Receiver<i64> {
        self.newest_event.subscribe()
    }

    async fn append_audit(&self, record: AuditRecord) -> Result<(), SessionError> {
        let mut tx = self.pool.begin().await?;
        insert_audit(&mut tx, &record).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn list_audit(
        &self,
        session_id: Option<&str>,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<AuditRow>, SessionError> {
        let caller = session_id.map(|id| format!("session:{id}"));
        let rows = sqlx::query(
            "SELECT id, at_ms, caller, action, target, allowed, reason, detail FROM audit \
             WHERE id > ?1 AND (?2 IS NULL OR target = ?2 OR caller = ?3) \
             ORDER BY id LIMIT ?4",
        )
        .bind(after_id)
        .bind(session_id)
        .bind(caller)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(AuditRow {
                    id: row.try_get("id")?,
                    at_ms: row.try_get("at_ms")?,
                    caller: row.try_get("caller")?,
                    action: row.try_get("action")?,
                    target: row.try_get("target")?,
                    allowed: row.try_get("allowed")?,
                    reason: row.try_get("reason")?,
                    detail: row.try_get("detail")?,
                })
            })
            .collect()
    }

    async fn signing_keys(&self) -> Result<Vec<(String, Vec<u8>)>, SessionError> {
        Ok(
            sqlx::query_as("SELECT kid, secret FROM signing_keys ORDER BY created_at_ms DESC, kid")
                .fetch_all(&self.pool)
                .await?,
        )
    }

    async fn add_signing_key(&self, kid: &str, secret: &[u8]) -> Result<(), SessionError> {
        sqlx::query("INSERT INTO signing_keys (kid, secret, created_at_ms) VALUES (?, ?, ?)")
            .bind(kid)
            .bind(secret)
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
