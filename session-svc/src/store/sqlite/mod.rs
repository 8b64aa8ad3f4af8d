//! [`SqliteStore`]: the embedded store. WAL journal, migrations at open.
//!
//! Every write goes through one writer connection, in a `BEGIN IMMEDIATE`
//! transaction ([`write::Write`]): writes are serialised in this process
//! without SQLite's sleeping busy handler, and the transaction takes the
//! database's write lock up front, so a check and the write it guards see
//! the same state even if another process writes. Reads use a pool of
//! connections and never wait for writers (WAL).

mod process;
mod write;

use std::{str::FromStr, sync::Arc, time::Duration};

use serde_json::json;
use sqlx::{
    Connection, Row, SqliteConnection, SqlitePool,
    sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
    },
};
use tokio::sync::{Mutex, watch};
use troupe_proto::status::parse_status;

use self::write::{Write, insert_audit, quota_json, select_session};
use super::{Created, EventPage, MessageCheck, RootCheck, Sent, SpawnCheck, Store, TerminateCheck};
use crate::{
    error::{QuotaLeft, SessionError},
    model::{
        AuditRecord, AuditRow, EventFilter, EventRow, Idempotency, NewMessage, NewSession,
        SessionRow, Trust, now_ms,
    },
    policy::SpawnContext,
};

/// The SQLite store.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    /// Readers.
    pool: SqlitePool,
    /// The one connection every write goes through.
    writer: Arc<Mutex<SqliteConnection>>,
    /// Bumped after every commit that wrote events.
    events_written: watch::Sender<u64>,
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
        let migrating = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await?;
        sqlx::migrate!("./migrations/sqlite")
            .run(&migrating)
            .await
            .map_err(|e| SessionError::Internal(format!("migration failed: {e}")))?;
        migrating.close().await;
        let writer = SqliteConnection::connect_with(&options).await?;
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options.read_only(true))
            .await?;
        let (events_written, _) = watch::channel(0);
        Ok(SqliteStore {
            pool,
            writer: Arc::new(Mutex::new(writer)),
            events_written,
        })
    }

    /// Wakes the watchers after a commit that wrote events.
    fn published(&self) {
        self.events_written.send_modify(|n| *n = n.wrapping_add(1));
    }
}

fn session_from_row(row: &SqliteRow) -> Result<SessionRow, SessionError> {
    use sqlx::FromRow;
    RawSession::from_row(row)?.into_row()
}

/// A session row as stored: read from SQL rows, and from the JSON arrays of
/// `list_workspace`'s pages, whose element order is this field order.
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

impl Store for SqliteStore {
    async fn create_root(
        &self,
        new: NewSession,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        check: RootCheck<'_>,
    ) -> Result<Created, SessionError> {
        let mut conn = self.writer.lock().await;
        let mut w = Write::begin(&mut conn).await?;
        if let Some(result) = w.replay(idem.as_ref()).await? {
            return replayed_create(result);
        }
        let quota = check(w.active_in_workspace(&new.workspace_id).await?)?;
        let tree_id = format!("tree_{}", uuid::Uuid::now_v7().simple());
        let session = w.insert_session(&new, None, &tree_id, 0).await?;
        w.audit(&audit).await?;
        w.remember(
            idem.as_ref(),
            json!({"session_id": session.session_id, "quota": quota_json(&quota)}),
        )
        .await?;
        w.commit().await?;
        self.published();
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
        let mut conn = self.writer.lock().await;
        let mut w = Write::begin(&mut conn).await?;
        if let Some(result) = w.replay(idem.as_ref()).await? {
            return replayed_create(result);
        }
        let facts = w
            .spawn_facts(parent_id)
            .await?
            .ok_or_else(|| SessionError::not_found(parent_id))?;
        let admission = check(&SpawnContext {
            parent: &facts.parent,
            tree_sessions: facts.tree_sessions,
            children: facts.children,
            workspace_active: facts.workspace_active,
            now_ms: now_ms(),
        })?;
        let parent = &facts.parent;
        if admission.parent_spawn_tat_ms != parent.spawn_tat_ms {
            w.set_spawn_tat(&parent.session_id, admission.parent_spawn_tat_ms)
                .await?;
        }
        let session = w
            .insert_session(&new, Some(parent), &parent.tree_id, admission.depth)
            .await?;
        w.audit(&audit).await?;
        w.remember(
            idem.as_ref(),
            json!({"session_id": session.session_id, "quota": quota_json(&admission.quota)}),
        )
        .await?;
        w.commit().await?;
        self.published();
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
        let mut conn = self.writer.lock().await;
        let mut w = Write::begin(&mut conn).await?;
        if let Some(result) = w.replay(idem.as_ref()).await? {
            let bad = || SessionError::Internal("bad idempotency record".to_owned());
            return Ok(Sent {
                message_id: result["message_id"].as_str().ok_or_else(bad)?.to_owned(),
                sequence: result["sequence"].as_u64().ok_or_else(bad)?,
                replayed: true,
            });
        }
        let target = w
            .session(recipient)
            .await?
            .ok_or_else(|| SessionError::not_found(recipient))?;
        check(&target)?;
        let sequence = w.message(&target, &message).await?;
        w.audit(&audit).await?;
        w.remember(
            idem.as_ref(),
            json!({"message_id": message.message_id, "sequence": sequence}),
        )
        .await?;
        w.commit().await?;
        self.published();
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
        let mut conn = self.writer.lock().await;
        let mut w = Write::begin(&mut conn).await?;
        let row = w
            .session(target)
            .await?
            .ok_or_else(|| SessionError::not_found(target))?;
        let ancestors = w.ancestors(target).await?;
        check(&row, &ancestors)?;
        let ended = w.end_subtree(target, reason, terminated_by).await?;
        let mut audit = audit;
        audit.detail = json!({"terminated": ended}).to_string();
        w.audit(&audit).await?;
        let row = w
            .session(target)
            .await?
            .ok_or_else(|| SessionError::not_found(target))?;
        w.commit().await?;
        self.published();
        Ok((ended, row))
    }

    async fn get_session(&self, session_id: &str) -> Result<Option<SessionRow>, SessionError> {
        let sql = concat!(select_session!(), " FROM sessions WHERE session_id = ?");
        let row = sqlx::query(sql)
            .bind(session_id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(session_from_row).transpose()
    }

    async fn children(&self, session_id: &str) -> Result<Vec<SessionRow>, SessionError> {
        let sql = concat!(
            select_session!(),
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
        // SQLite worker thread instead of one per session. Each session is an
        // array in `RawSession`'s field order (serde reads structs from arrays).
        let page: String = sqlx::query_scalar(
            "SELECT json_group_array(json_array( \
               rowid, session_id, workspace_id, parent_session_id, parent_trust_level, tree_id, \
               depth, trust_level, agent_name, agent_command, title, status, created_by, \
               created_at_ms, ended_at_ms, end_reason, spawn_tat_ms, inbox_seq)) \
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
        let mut conn = self.writer.lock().await;
        let mut w = Write::begin(&mut conn).await?;
        let pruned = w.prune_events(keep).await?;
        w.commit().await?;
        Ok(pruned)
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.events_written.subscribe()
    }

    async fn newest_event(&self) -> Result<i64, SessionError> {
        Ok(
            sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM events")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    async fn append_audit(&self, record: AuditRecord) -> Result<(), SessionError> {
        let mut conn = self.writer.lock().await;
        insert_audit(&mut conn, &record).await
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
            .execute(&mut *self.writer.lock().await)
            .await?;
        Ok(())
    }

    async fn start_process(
        &self,
        session_id: &str,
        notify_parent: bool,
    ) -> Result<(), SessionError> {
        self.start_process_impl(session_id, notify_parent).await
    }

    async fn record_process(
        &self,
        session_id: &str,
        runner_seq: u64,
        change: crate::model::ProcessChange,
        tail_max: usize,
    ) -> Result<Option<SessionRow>, SessionError> {
        self.record_process_impl(session_id, runner_seq, change, tail_max)
            .await
    }

    async fn process(
        &self,
        session_id: &str,
    ) -> Result<Option<crate::model::ProcessRow>, SessionError> {
        self.process_impl(session_id).await
    }

    async fn undelivered(
        &self,
        session_id: &str,
    ) -> Result<Vec<crate::model::InboxMessage>, SessionError> {
        self.undelivered_impl(session_id).await
    }

    async fn mark_delivered(&self, session_id: &str, seq: u64) -> Result<(), SessionError> {
        self.mark_delivered_impl(session_id, seq).await
    }

    async fn active_sessions(&self) -> Result<Vec<SessionRow>, SessionError> {
        self.active_sessions_impl().await
    }

    async fn fail_session(
        &self,
        session_id: &str,
        detail: &str,
        audit: AuditRecord,
    ) -> Result<bool, SessionError> {
        self.fail_session_impl(session_id, detail, audit).await
    }
}
