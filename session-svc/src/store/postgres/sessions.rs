//! The session write paths: creating a root or a child session, sending a
//! message (ends are written once, in `store::ends`). Each is one transaction that locks what
//! its check reads (see `locks`), checks, writes, and writes its events
//! last (see `events`).

use sqlx::PgConnection;
use troupe_proto::session::SessionStatus;

use super::{
    PgStore, budgets,
    events::{self, NewEvent},
    groups, locks,
    open::{RawSession, session_columns},
};
use crate::{
    error::SessionError,
    model::{AuditRecord, Idempotency, NewMessage, NewSession, Sending, SessionRow, Trust, now_ms},
    policy::{self, SpawnContext},
    store::{
        Bounds, Created, MessageCheck, RootCheck, Sent, SpawnCheck,
        accounts::stored_budget,
        shared::{create_record, replayed_create, replayed_sent, sent_record},
    },
};

impl PgStore {
    pub(in crate::store) async fn create_root_once(
        &self,
        new: &NewSession,
        idem: Option<&Idempotency>,
        audit: &AuditRecord,
        check: RootCheck<'_>,
    ) -> Result<Created, SessionError> {
        let mut tx = self.begin().await?;
        if let Some(idem) = idem
            && let Some(result) = events::claim(&mut tx, idem).await?
        {
            return replayed_create(&result);
        }
        // The workspace's row, made on its first root, locked either way.
        let active: i32 = sqlx::query_scalar(
            "INSERT INTO workspaces (workspace_id) VALUES ($1) \
             ON CONFLICT (workspace_id) DO UPDATE SET active_direct = workspaces.active_direct \
             RETURNING active_direct + active_sandboxed",
        )
        .bind(&new.workspace_id)
        .fetch_one(&mut *tx)
        .await?;
        let quota = check(active.max(0) as u32)?;
        let tree_id = format!("tree_{}", uuid::Uuid::now_v7().simple());
        sqlx::query("INSERT INTO trees (tree_id, sessions, sandboxed) VALUES ($1, 1, $2)")
            .bind(&tree_id)
            .bind(i32::from(new.trust == Trust::Sandboxed))
            .execute(&mut *tx)
            .await?;
        let session = insert_session(&mut tx, new, None, &tree_id, 0).await?;
        budgets::insert_account(
            &mut tx,
            &new.session_id,
            0,
            stored_budget(&new.budget)?,
            policy::deadline(&new.budget, &[], now_ms()),
        )
        .await?;
        events::remember(&mut tx, idem, create_record(&new.session_id, &quota)).await?;
        PgStore::insert_audit(&mut tx, audit).await?;
        events::write(&mut tx, &created_events(new), false).await?;
        tx.commit().await?;
        self.published(false);
        Ok(Created::New {
            session: Box::new(session),
            quota,
        })
    }

    pub(in crate::store) async fn create_child_once(
        &self,
        parent_id: &str,
        new: &NewSession,
        idem: Option<&Idempotency>,
        audit: &AuditRecord,
        check: SpawnCheck<'_>,
    ) -> Result<Created, SessionError> {
        let mut tx = self.begin().await?;
        if let Some(idem) = idem
            && let Some(result) = events::claim(&mut tx, idem).await?
        {
            return replayed_create(&result);
        }
        let (workspace_id, tree_id) = locks::place(&mut tx, parent_id).await?;
        let workspace_active = locks::workspace(&mut tx, &workspace_id).await?;
        let (tree_sessions, tree_sandboxed) = locks::tree(&mut tx, &tree_id).await?;
        let (parent, children) = locks::session(&mut tx, parent_id).await?;
        // Read, not locked: a reservation racing this create only makes the
        // check stricter, and every call is checked against every ancestor.
        let accounts = crate::store::budgets::postgres::path(&mut tx, parent_id, false).await?;
        let admission = check(&SpawnContext {
            parent: &parent,
            tree_sessions,
            tree_sandboxed,
            children,
            workspace_active,
            accounts: &accounts,
            budget: &new.budget,
            now_ms: now_ms(),
        })?;
        sqlx::query(
            "UPDATE trees SET sessions = sessions + 1, sandboxed = sandboxed + $2 \
             WHERE tree_id = $1",
        )
        .bind(&tree_id)
        .bind(i32::from(new.trust == Trust::Sandboxed))
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE sessions SET children = children + 1, spawn_tat_ms = $2 WHERE session_id = $1",
        )
        .bind(parent_id)
        .bind(admission.parent_spawn_tat_ms)
        .execute(&mut *tx)
        .await?;
        let session = insert_session(
            &mut tx,
            new,
            Some(&parent),
            &parent.tree_id,
            admission.depth,
        )
        .await?;
        budgets::insert_account(
            &mut tx,
            &new.session_id,
            admission.depth,
            stored_budget(&new.budget)?,
            admission.deadline_ms,
        )
        .await?;
        events::remember(
            &mut tx,
            idem,
            create_record(&new.session_id, &admission.quota),
        )
        .await?;
        PgStore::insert_audit(&mut tx, audit).await?;
        events::write(&mut tx, &created_events(new), false).await?;
        tx.commit().await?;
        self.published(false);
        Ok(Created::New {
            session: Box::new(session),
            quota: admission.quota,
        })
    }

    pub(in crate::store) async fn send_message_once(
        &self,
        recipient: &str,
        message: &NewMessage,
        idem: Option<&Idempotency>,
        audit: &AuditRecord,
        bounds: Bounds<'_>,
        check: MessageCheck<'_>,
    ) -> Result<Sent, SessionError> {
        let mut tx = self.begin().await?;
        if let Some(idem) = idem
            && let Some(result) = events::claim(&mut tx, idem).await?
        {
            return replayed_sent(&result);
        }
        // The sender's rate row before any session row (see `locks`).
        let rate = match bounds.throttle {
            Some(t) => Some(groups::lock_rate(&mut tx, t.sender).await?),
            None => None,
        };
        let (target, _) = locks::session(&mut tx, recipient).await?;
        check(&target)?;
        let recipient_id = std::slice::from_ref(&target.session_id);
        let unread = groups::unread_bytes(&mut tx, recipient_id).await?;
        let held = unread.get(&target.session_id).copied().unwrap_or(0);
        (bounds.inbox)(held, message.body.len() as u64)?;
        if let (Some(t), Some(rate)) = (bounds.throttle, rate) {
            let new_rate = (t.check)(rate, Sending::to_each(1, &message.body))?;
            groups::set_rate(&mut tx, t.sender, new_rate).await?;
        }
        let sequence = insert_message(&mut tx, recipient, message).await?;
        events::remember(
            &mut tx,
            idem,
            sent_record(&message.message_id, sequence as u64),
        )
        .await?;
        PgStore::insert_audit(&mut tx, audit).await?;
        let event = NewEvent::message(
            recipient,
            target.status,
            &message.message_id,
            sequence,
            &message.body,
        );
        events::write(&mut tx, &[event], false).await?;
        tx.commit().await?;
        self.published(false);
        Ok(Sent {
            message_id: message.message_id.clone(),
            sequence: sequence as u64,
            replayed: false,
        })
    }
}

/// The events of a new session: created, and its initial message's.
fn created_events(new: &NewSession) -> Vec<NewEvent> {
    let mut out = vec![NewEvent::created(
        &new.session_id,
        &new.agent_name,
        &new.title,
    )];
    if let Some(m) = &new.initial_message {
        out.push(NewEvent::message(
            &new.session_id,
            SessionStatus::Pending,
            &m.message_id,
            1,
            &m.body,
        ));
    }
    out
}

/// Inserts a pending session, counts it active in its workspace (whose row
/// the caller locked), and stores its initial message; returns its row.
async fn insert_session(
    conn: &mut PgConnection,
    new: &NewSession,
    parent: Option<&SessionRow>,
    tree_id: &str,
    depth: u32,
) -> Result<SessionRow, SessionError> {
    let raw: RawSession = sqlx::query_as(concat!(
        "INSERT INTO sessions (session_id, workspace_id, parent_session_id, parent_trust_level, \
         tree_id, depth, trust_level, agent_name, agent_command, title, status, created_by, \
         created_at_ms, traceparent, spawn_span_id, notify_parent, writable_paths, on_parent_end) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'pending', $11, $12, $13, $14, $15, $16, \
           $17) \
         RETURNING ",
        session_columns!()
    ))
    .bind(&new.session_id)
    .bind(&new.workspace_id)
    .bind(parent.map(|p| p.session_id.as_str()))
    .bind(parent.map(|p| p.trust.as_str()))
    .bind(tree_id)
    .bind(depth as i32)
    .bind(new.trust.as_str())
    .bind(&new.agent_name)
    .bind(&new.agent_command)
    .bind(&new.title)
    .bind(new.created_by.to_string())
    .bind(now_ms())
    .bind(new.trace.map(|t| t.traceparent()))
    .bind(new.trace.map(|t| t.spawn_span_id.to_string()))
    .bind(new.notify_parent)
    .bind(crate::store::scope_text(&new.write_scope))
    .bind(new.on_parent_end.as_str())
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE workspaces SET \
           active_direct = active_direct + ($2 = 'direct')::int, \
           active_sandboxed = active_sandboxed + ($2 = 'sandboxed')::int \
         WHERE workspace_id = $1",
    )
    .bind(&new.workspace_id)
    .bind(new.trust.as_str())
    .execute(&mut *conn)
    .await?;
    let mut session = raw.into_row()?;
    if let Some(message) = &new.initial_message {
        session.inbox_seq = insert_message(conn, &new.session_id, message).await?;
    }
    Ok(session)
}

/// Appends a message to one inbox, its body stored with it (the
/// recipient's row is locked by the caller, or new); returns its sequence.
pub(super) async fn insert_message(
    conn: &mut PgConnection,
    recipient: &str,
    message: &NewMessage,
) -> Result<i64, SessionError> {
    insert_body(&mut *conn, &message.message_id, &message.body).await?;
    insert_entry(conn, recipient, message, &message.message_id).await
}

/// Stores a message's body once, under `body_id`.
pub(super) async fn insert_body(
    conn: &mut PgConnection,
    body_id: &str,
    body: &str,
) -> Result<(), SessionError> {
    sqlx::query("INSERT INTO message_bodies (body_id, body) VALUES ($1, $2)")
        .bind(body_id)
        .bind(body)
        .execute(conn)
        .await?;
    Ok(())
}

/// Appends `message` to an inbox, its body the one stored under `body_id`
/// (the recipient's row is locked by the caller, or new), and counts its
/// bytes unread; returns its sequence.
pub(super) async fn insert_entry(
    conn: &mut PgConnection,
    recipient: &str,
    message: &NewMessage,
    body_id: &str,
) -> Result<i64, SessionError> {
    let bytes = message.body.len() as i64;
    let seq: i64 = sqlx::query_scalar(
        "UPDATE sessions SET inbox_seq = inbox_seq + 1, unread_bytes = unread_bytes + $2 \
         WHERE session_id = $1 RETURNING inbox_seq",
    )
    .bind(recipient)
    .bind(bytes)
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO messages (message_id, session_id, seq, sender, body, body_id, bytes, \
         created_at_ms) VALUES ($1, $2, $3, $4, '', $5, $6, $7)",
    )
    .bind(&message.message_id)
    .bind(recipient)
    .bind(seq)
    .bind(message.sender.to_string())
    .bind(body_id)
    .bind(bytes)
    .bind(now_ms())
    .execute(conn)
    .await?;
    Ok(seq)
}
