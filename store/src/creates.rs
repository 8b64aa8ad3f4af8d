//! Creating a root or a child session, written once for both backends (see
//! `backends`). Each is one `Batched` transaction: the request id's claim,
//! the facts its rule reads (`Batched::workspace_active`,
//! `Batched::spawn_facts`: on PostgreSQL the counter rows locked in the
//! lock order of `postgres::locks`; on SQLite the ledger, exact under the
//! writer lock), the rule, then the writes: the counters, the row, its
//! account and initial message, the request id, the audit entry, and its
//! events last. On SQLite those writes leave as one batch at the commit.

use std::future::Future;

use troupe_proto::session::SessionStatus;

use super::{Created, RootCheck, SpawnCheck, backends::each_backend};
use crate::{
    error::SessionError,
    model::{AuditRecord, Idempotency, NewSession, SessionId, SessionRow, Trust},
};

/// What a spawn's rule reads of its parent's place, as the transaction has
/// it.
pub(crate) struct SpawnFacts {
    pub parent: SessionRow,
    /// Sessions of the parent's tree, ended ones included.
    pub tree_sessions: u32,
    /// Of those, the sandboxed ones.
    pub tree_sandboxed: u32,
    /// Children the parent ever created.
    pub children: u32,
    /// Pending or running sessions of the parent's workspace.
    pub workspace_active: u32,
}

/// The row `new` is inserted as, below `parent` (none: a root) in
/// `tree_id` at `depth`, at `at_ms`, its inbox empty: what both backends
/// store and return.
pub(crate) fn pending_row(
    new: &NewSession,
    parent: Option<&SessionRow>,
    tree_id: &str,
    depth: u32,
    at_ms: i64,
) -> SessionRow {
    SessionRow {
        session_id: new.session_id.clone(),
        workspace_id: new.workspace_id.clone(),
        parent_session_id: parent.map(|p| p.session_id.clone()),
        parent_trust: parent.map(|p| p.trust),
        tree_id: tree_id.into(),
        depth,
        trust: new.trust,
        agent_name: new.agent_name.clone(),
        agent_command: new.agent_command.clone(),
        title: new.title.clone(),
        status: SessionStatus::Pending,
        created_by: new.created_by.clone(),
        created_at_ms: at_ms,
        ended_at_ms: None,
        end_reason: None,
        spawn_tat_ms: 0,
        inbox_seq: 0,
        trace: new.trace,
        write_scope: new.write_scope.clone(),
        on_parent_end: new.on_parent_end,
        orphaned: false,
    }
}

/// Inserts a pending session: id, workspace, parent, its trust, tree,
/// depth, trust, agent, command, title, creator, time, traceparent, spawn
/// span, whether its parent is told of its end, write scope, parent-end
/// policy, the workspace's shard (SQLite's adds `RETURNING rowid`).
pub(crate) const INSERT_SESSION: &str = "INSERT INTO sessions (session_id, workspace_id, \
     parent_session_id, parent_trust_level, tree_id, depth, trust_level, agent_name, agent_command, \
     title, status, created_by, created_at_ms, traceparent, spawn_span_id, notify_parent, \
     writable_paths, on_parent_end, shard) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'pending', $11, $12, $13, $14, $15, $16, $17, \
     $18)";

/// Binds `row`'s values (and whether its parent is told of its end) to
/// [`INSERT_SESSION`]'s parameters, in order: on a query, or a batch.
macro_rules! bind_session {
    ($q:expr, $row:expr, $notify_parent:expr) => {
        $q.bind($row.session_id.clone())
            .bind($row.workspace_id.clone())
            .bind($row.parent_session_id.clone())
            .bind($row.parent_trust.map(crate::model::Trust::as_str))
            .bind($row.tree_id.clone())
            .bind($row.depth as i32)
            .bind($row.trust.as_str())
            .bind($row.agent_name.clone())
            .bind($row.agent_command.clone())
            .bind($row.title.clone())
            .bind($row.created_by.to_string())
            .bind($row.created_at_ms)
            .bind($row.trace.map(|t| t.traceparent()))
            .bind($row.trace.map(|t| t.spawn_span_id.to_string()))
            .bind($notify_parent)
            .bind(crate::scope_text(&$row.write_scope))
            .bind($row.on_parent_end.as_str())
            .bind(i32::from(
                crate::shard::Shard::of(&$row.workspace_id).index(),
            ))
    };
}
pub(crate) use bind_session;

/// 1 for a sandboxed session, for the counters of its kind.
pub(crate) fn sandboxed(trust: Trust) -> i32 {
    i32::from(trust == Trust::Sandboxed)
}

/// Creating sessions; every [`super::Store`] is one.
pub trait SpawnStore: Send + Sync {
    /// Inserts a root session (a new tree whose id is the session id's tree).
    fn create_root(
        &self,
        new: NewSession,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        check: RootCheck<'_>,
    ) -> impl Future<Output = Result<Created, SessionError>> + Send;

    /// Inserts a child of `parent_id` if `check` admits it.
    fn create_child(
        &self,
        parent_id: &SessionId,
        new: NewSession,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        check: SpawnCheck<'_>,
    ) -> impl Future<Output = Result<Created, SessionError>> + Send;
}

each_backend! {
    use crate::{
        error::{QuotaLeft, SessionError},
        model::{AuditRecord, Idempotency, NewSession, now_ms},
        policy::{self, SpawnContext},
        {
            Created, RootCheck, SpawnCheck,
            accounts::stored_budget,
            creates::pending_row,
            journal::NewEvent,
            shared::{create_record, replayed_create},
        },
    };

    impl SpawnStore for This {
        async fn create_root(
            &self,
            new: NewSession,
            idem: Option<Idempotency>,
            audit: AuditRecord,
            check: RootCheck<'_>,
        ) -> Result<Created, SessionError> {
            let (new, idem, audit) = (&new, idem.as_ref(), &audit);
            retrying!(async {
                let mut tx = self.batched().await?;
                if let Some(idem) = idem
                    && let Some(result) = tx.claim(idem).await?
                {
                    return replayed_create(&result);
                }
                let quota = check(tx.workspace_active(&new.workspace_id).await?)?;
                let limits = stored_budget(&new.budget)?;
                let tree_id = format!("tree_{}", uuid::Uuid::now_v7().simple());
                let deadline_ms = policy::deadline(&new.budget, &[], now_ms());
                tx.count_root(&tree_id, new.trust).await?;
                let mut session = pending_row(new, None, &tree_id, 0, now_ms());
                let events = insert(&mut tx, new, &mut session, limits, deadline_ms).await?;
                self.created(tx, new, idem, audit, &quota, &events).await?;
                Ok(Created::New {
                    session: Box::new(session),
                    quota,
                })
            })
        }

        async fn create_child(
            &self,
            parent_id: &SessionId,
            new: NewSession,
            idem: Option<Idempotency>,
            audit: AuditRecord,
            check: SpawnCheck<'_>,
        ) -> Result<Created, SessionError> {
            let (new, idem, audit) = (&new, idem.as_ref(), &audit);
            retrying!(async {
                let mut tx = self.batched().await?;
                if let Some(idem) = idem
                    && let Some(result) = tx.claim(idem).await?
                {
                    return replayed_create(&result);
                }
                let facts = tx.spawn_facts(parent_id).await?;
                // Read, not locked: a reservation racing this create only makes
                // the check stricter, and every call is checked against every
                // ancestor.
                let accounts = This::account_path(tx.conn(), parent_id, false).await?;
                let limits = stored_budget(&new.budget)?;
                let parent = &facts.parent;
                let admission = check(&SpawnContext {
                    parent,
                    tree_sessions: facts.tree_sessions,
                    tree_sandboxed: facts.tree_sandboxed,
                    children: facts.children,
                    workspace_active: facts.workspace_active,
                    accounts: &accounts,
                    budget: &new.budget,
                    now_ms: now_ms(),
                })?;
                tx.count_child(parent, admission.parent_spawn_tat_ms, new.trust)
                    .await?;
                let mut session = pending_row(new, Some(parent), &parent.tree_id, admission.depth, now_ms());
                let events = insert(&mut tx, new, &mut session, limits, admission.deadline_ms).await?;
                self.created(tx, new, idem, audit, &admission.quota, &events).await?;
                Ok(Created::New {
                    session: Box::new(session),
                    quota: admission.quota,
                })
            })
        }
    }

    impl This {

        /// A create's last writes: its request id, its audit entry, its
        /// events; then the commit.
        async fn created(
            &self,
            mut tx: Batched<'_>,
            new: &NewSession,
            idem: Option<&Idempotency>,
            audit: &AuditRecord,
            quota: &QuotaLeft,
            events: &[NewEvent],
        ) -> Result<(), SessionError> {
            tx.remember(idem, create_record(&new.session_id, quota)).await?;
            tx.audit(audit).await?;
            tx.events(events).await?;
            tx.commit().await?;
            self.committed(false);
            Ok(())
        }
    }

    /// Inserts `session` (the row of `new`, its inbox empty), its account
    /// and its initial message, which `session`'s inbox then holds; returns
    /// its events.
    async fn insert(
        tx: &mut Batched<'_>,
        new: &NewSession,
        session: &mut crate::model::SessionRow,
        limits: [Option<i64>; 4],
        deadline_ms: Option<i64>,
    ) -> Result<Vec<NewEvent>, SessionError> {
        tx.insert_session(session, new.notify_parent).await?;
        tx.account(&new.session_id, session.depth, limits, deadline_ms).await?;
        let mut events = vec![NewEvent::created(&new.session_id, &new.agent_name, &new.title)];
        if let Some(message) = &new.initial_message {
            let (sequence, event) = tx.deliver_new(session, message).await?;
            session.inbox_seq = sequence as i64;
            events.push(event);
        }
        Ok(events)
    }
}
