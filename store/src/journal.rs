//! The store's two logs, written once for both backends (see `backends`):
//! the events watchers page through and the audit trail. Reads run on the
//! read pool; an audit entry is appended alone or inside a caller's
//! transaction (`insert_audit`).
//!
//! Events are paged by shard (`troupe_domain::cursor`): a watch of one
//! workspace reads one index range, a watch of all of them one per shard.
//! A shard's pruning mark comes with its rows (one snapshot), or is read
//! after the page for a shard without any: a cursor the pruning has passed
//! is expired, never a silent gap.

use std::future::Future;

use troupe_proto::session::SessionStatus;

use super::{EventPage, backends::each_backend, changes::ChangeWatch};
use crate::{
    cursor::{Cursor, Heads},
    error::SessionError,
    model::{
        AuditRecord, AuditRow, Created, EventDetail, EventFilter, EventKind, MessageQueued,
        SessionId, TreeId, WorkspaceId,
    },
};

/// The page of one shard's events after a position: `$1` session, `$2`
/// tree, `$3` workspace, `$4` sandboxed only, `$5` ends only, `$6` the
/// limit; the shard and the position are bound as `$n` and `$n+1`.
fn shard_page(n: usize) -> String {
    format!(
        "SELECT * FROM (SELECT e.id, e.shard, e.shard_seq, e.seq, e.kind, e.status, e.at_ms, \
           e.detail, e.session_id, s.workspace_id, s.parent_session_id, s.parent_trust_level, \
           s.tree_id, s.depth, s.trust_level, \
           (SELECT pruned_through FROM event_shards WHERE shard = ${n}) AS pruned \
         FROM events e JOIN sessions s ON s.session_id = e.session_id \
         WHERE e.shard = ${n} AND e.shard_seq > ${} \
           AND (CAST($1 AS TEXT) IS NULL OR e.session_id = $1) \
           AND (CAST($2 AS TEXT) IS NULL OR s.tree_id = $2) \
           AND (CAST($3 AS TEXT) IS NULL OR s.workspace_id = $3) \
           AND (NOT $4 OR s.trust_level = 'sandboxed') \
           AND (NOT $5 OR e.kind IN ('completed', 'failed', 'terminated')) \
         ORDER BY e.shard_seq LIMIT $6) AS m{n}",
        n + 1
    )
}

/// A page of `shards` shards' events: each shard's page (an index range
/// each), then the first `$6` of them by id (in commit order within a
/// shard, so each shard's part of the page is the start of its own).
fn page_sql(shards: usize) -> String {
    let members: Vec<String> = (0..shards).map(|i| shard_page(7 + 2 * i)).collect();
    format!(
        "SELECT * FROM ({}) AS p ORDER BY p.id LIMIT $6",
        members.join(" UNION ALL ")
    )
}

static ONE_SHARD: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| page_sql(1));
static EVERY_SHARD: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| page_sql(usize::from(crate::shard::SHARDS)));

/// An event to append, last in its transaction (`This::append_events`).
pub(crate) struct NewEvent {
    pub session_id: String,
    pub kind: EventKind,
    /// The session's status when it is written.
    pub status: SessionStatus,
    pub detail: String,
    /// Bytes printed, for output.
    pub bytes: Option<i64>,
}

impl NewEvent {
    pub fn new(
        session_id: &str,
        kind: EventKind,
        status: SessionStatus,
        detail: &EventDetail,
    ) -> NewEvent {
        NewEvent {
            session_id: session_id.to_owned(),
            kind,
            status,
            detail: detail.to_json(),
            bytes: None,
        }
    }

    /// A new session's `created` event.
    pub fn created(session_id: &str, agent_name: &str, title: &str) -> NewEvent {
        NewEvent::new(
            session_id,
            EventKind::Created,
            SessionStatus::Pending,
            &created_detail(agent_name, title),
        )
    }

    /// The `message` event of an inbox message (`status`: the recipient's;
    /// `seq`: its inbox sequence).
    pub fn message(
        session_id: &str,
        status: SessionStatus,
        message_id: &str,
        seq: i64,
        body: &str,
    ) -> NewEvent {
        NewEvent::new(
            session_id,
            EventKind::Message,
            status,
            &message_detail(message_id, seq, body.len()),
        )
    }
}

/// Appends an audit entry: time, then [`AuditRecord`]'s fields in order.
pub(crate) const INSERT_AUDIT: &str = "INSERT INTO audit (at_ms, caller, action, target, allowed, reason, detail) \
     VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// Binds an audit entry's values, stamped now, to [`INSERT_AUDIT`]'s
/// parameters, in order: on a query, or a batch.
macro_rules! bind_audit {
    ($q:expr, $record:expr) => {
        $q.bind(crate::model::now_ms())
            .bind($record.caller.to_string())
            .bind($record.action.as_str())
            .bind($record.target.clone())
            .bind($record.allowed)
            .bind($record.reason.clone())
            .bind($record.detail.clone())
    };
}
pub(crate) use bind_audit;

/// The detail of a `created` event.
pub(crate) fn created_detail(agent_name: &str, title: &str) -> EventDetail {
    EventDetail::Created(Created {
        agent_name: agent_name.to_owned(),
        title: title.to_owned(),
    })
}

/// The detail of a `message` event: the message, its inbox sequence, its
/// body's size.
pub(crate) fn message_detail(message_id: &str, seq: i64, bytes: usize) -> EventDetail {
    EventDetail::Message(MessageQueued {
        message_id: message_id.to_owned(),
        inbox_sequence: seq.max(0) as u64,
        bytes: bytes as u64,
    })
}

/// The events and the audit trail; every [`super::Store`] is one.
pub trait LogStore: Send + Sync {
    /// Returns up to `limit` events after `after` that match `filter`: in
    /// each shard in their order there, across shards roughly in commit
    /// order. Expired if a shard the filter covers was pruned past the
    /// cursor's position in it.
    fn events_after(
        &self,
        filter: &EventFilter,
        after: &Cursor,
        limit: u32,
    ) -> impl Future<Output = Result<EventPage, SessionError>> + Send;

    /// Each shard's newest position and pruning mark.
    fn event_heads(&self) -> impl Future<Output = Result<Heads, SessionError>> + Send;

    /// The workspace of a tree's sessions (`None`: no such tree): the one
    /// shard a watch of the tree reads.
    fn tree_workspace(
        &self,
        tree_id: &TreeId,
    ) -> impl Future<Output = Result<Option<WorkspaceId>, SessionError>> + Send;

    fn append_audit(
        &self,
        record: AuditRecord,
    ) -> impl Future<Output = Result<(), SessionError>> + Send;

    /// Returns audit entries after `after_id`, optionally only those naming `session_id`.
    fn list_audit(
        &self,
        session_id: Option<&SessionId>,
        after_id: i64,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<AuditRow>, SessionError>> + Send;

    /// Returns a watch that wakes after commits that wrote events in
    /// `shards`.
    fn subscribe(&self, shards: crate::shard::ShardSet) -> ChangeWatch;

    /// Returns a receiver that changes after every commit that ended
    /// sessions (a subset of [`LogStore::subscribe`]'s).
    fn subscribe_ends(&self) -> tokio::sync::watch::Receiver<u64>;

    /// Returns a receiver that changes after a commit, here or on another
    /// replica, that may have made the driver work (`crate::work`).
    fn subscribe_work(&self) -> tokio::sync::watch::Receiver<u64>;

    /// The shards such commits named since the last call (every shard on
    /// SQLite, and after a notification may have been missed).
    fn take_work(&self) -> crate::shard::ShardSet;
}

each_backend! {
    use sqlx::Row;
    use troupe_proto::status::parse_status;

    use super::{ChangeWatch, EVERY_SHARD, LogStore, ONE_SHARD};
    use crate::{
        cursor::{Cursor, Heads},
        error::SessionError,
        model::{
            AuditRecord, AuditRow, EventFilter, EventKind, EventRow, Principal, SessionId, TreeId,
            Trust, WorkspaceId,
        },
        shard::{Shard, ShardSet},
        {AuditColumns, EventPage, audit_row, parse_stored},
    };


    impl This {
        /// Each shard's newest position and pruning mark.
        pub(crate) async fn heads(pool: &sqlx::Pool<Db>) -> Result<Heads, SessionError> {
            let rows: Vec<(i32, i64, i64)> =
                sqlx::query_as("SELECT shard, seq, pruned_through FROM event_shards")
                    .fetch_all(pool)
                    .await?;
            let mut heads = Heads::default();
            for (shard, newest, pruned) in rows {
                if let Some(shard) = u16::try_from(shard).ok().and_then(Shard::new) {
                    heads.set(shard, newest, pruned);
                }
            }
            Ok(heads)
        }

        /// Appends an audit entry on `conn`, inside or outside a transaction.
        pub(crate) async fn insert_audit(
            conn: &mut Conn,
            record: &AuditRecord,
        ) -> Result<(), SessionError> {
            crate::journal::bind_audit!(
                sqlx::query(crate::journal::INSERT_AUDIT),
                record
            )
            .execute(conn)
            .await?;
            Ok(())
        }
    }

    /// The shard an event row names.
    fn stored_shard(shard: i32) -> Result<Shard, SessionError> {
        u16::try_from(shard)
            .ok()
            .and_then(Shard::new)
            .ok_or_else(|| SessionError::Internal(format!("stored shard {shard}")))
    }

    impl LogStore for This {
        fn subscribe(&self, shards: ShardSet) -> ChangeWatch {
            self.events_written.watch(shards)
        }

        fn subscribe_ends(&self) -> tokio::sync::watch::Receiver<u64> {
            self.sessions_ended.subscribe()
        }

        fn subscribe_work(&self) -> tokio::sync::watch::Receiver<u64> {
            self.work.subscribe()
        }

        fn take_work(&self) -> crate::shard::ShardSet {
            self.work.take()
        }

        async fn events_after(
            &self,
            filter: &EventFilter,
            after: &Cursor,
            limit: u32,
        ) -> Result<EventPage, SessionError> {
            let shards = filter.shard().map_or(ShardSet::ALL, ShardSet::of);
            let sql = if shards.len() == 1 { &*ONE_SHARD } else { &*EVERY_SHARD };
            let mut query = sqlx::query(sql.as_str())
                .bind(filter.session_id.as_deref())
                .bind(filter.tree_id.as_deref())
                .bind(filter.workspace_id.as_deref())
                .bind(filter.sandboxed_only)
                .bind(filter.ends_only)
                .bind(i64::from(limit));
            let scope = if shards.len() == 1 { shards } else { ShardSet::ALL };
            for shard in scope.iter() {
                query = query.bind(i32::from(shard.index())).bind(after.after(shard));
            }
            let rows = query.fetch_all(&self.pool).await?;
            // A shard's pruning mark comes with its rows, from the page's
            // snapshot; a shard with none in the page has it read after
            // the page (a mark past the cursor then means events the page
            // may have missed, which is what an expired cursor says).
            let mut with_rows = ShardSet::default();
            let mut marks: Vec<(Shard, i64)> = Vec::with_capacity(shards.len());
            for row in &rows {
                let shard = stored_shard(row.try_get("shard")?)?;
                if !with_rows.contains(shard) {
                    with_rows.insert(shard);
                    marks.push((shard, row.try_get("pruned")?));
                }
            }
            if with_rows != shards {
                let heads = This::heads(&self.pool).await?;
                for shard in shards.iter().filter(|&s| !with_rows.contains(s)) {
                    marks.push((shard, heads.pruned(shard)));
                }
            }
            if let Some(&(shard, pruned_through)) =
                marks.iter().find(|(shard, pruned)| after.after(*shard) < *pruned)
            {
                return Ok(EventPage::Expired {
                    shard,
                    pruned_through,
                });
            }
            let mut events = Vec::with_capacity(rows.len());
            for row in &rows {
                let trust: String = row.try_get("trust_level")?;
                let parent_trust: Option<String> = row.try_get("parent_trust_level")?;
                let depth: i32 = row.try_get("depth")?;
                events.push(EventRow {
                    shard: stored_shard(row.try_get("shard")?)?,
                    position: row.try_get("shard_seq")?,
                    seq: row.try_get("seq")?,
                    kind: parse_stored("event kind", row.try_get("kind")?, EventKind::parse)?,
                    status: parse_stored("status", row.try_get("status")?, parse_status)?,
                    at_ms: row.try_get("at_ms")?,
                    detail: row.try_get("detail")?,
                    session_id: row.try_get("session_id")?,
                    workspace_id: row.try_get("workspace_id")?,
                    parent_session_id: row.try_get("parent_session_id")?,
                    parent_trust: parent_trust
                        .as_deref()
                        .map(|t| parse_stored("trust level", t, Trust::from_db))
                        .transpose()?,
                    tree_id: row.try_get("tree_id")?,
                    depth: depth as u32,
                    trust: parse_stored("trust level", &trust, Trust::from_db)?,
                });
            }
            Ok(EventPage::Events(events))
        }

        async fn event_heads(&self) -> Result<Heads, SessionError> {
            This::heads(&self.pool).await
        }

        async fn tree_workspace(&self, tree_id: &TreeId) -> Result<Option<WorkspaceId>, SessionError> {
            let workspace: Option<String> =
                sqlx::query_scalar("SELECT workspace_id FROM sessions WHERE tree_id = $1 LIMIT 1")
                    .bind(tree_id.as_str())
                    .fetch_optional(&self.pool)
                    .await?;
            Ok(workspace.map(WorkspaceId::from))
        }

        async fn append_audit(&self, record: AuditRecord) -> Result<(), SessionError> {
            This::insert_audit(&mut *self.write_conn().await?, &record).await
        }

        async fn list_audit(
            &self,
            session_id: Option<&SessionId>,
            after_id: i64,
            limit: u32,
        ) -> Result<Vec<AuditRow>, SessionError> {
            let caller = session_id.map(|id| Principal::Session(id.clone()).to_string());
            let rows: Vec<AuditColumns> = sqlx::query_as(
                "SELECT id, at_ms, caller, action, target, allowed, reason, detail FROM audit \
                 WHERE id > $1 AND (CAST($2 AS TEXT) IS NULL OR target = $2 OR caller = $3) \
                 ORDER BY id LIMIT $4",
            )
            .bind(after_id)
            .bind(session_id)
            .bind(caller)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
            Ok(rows.into_iter().map(audit_row).collect())
        }
    }
}
