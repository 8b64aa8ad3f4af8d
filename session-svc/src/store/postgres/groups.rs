//! Messages to many and named groups on PostgreSQL. A fan-out is one
//! transaction: the sender's rate row first, then the candidates' session
//! rows, locked in id order (so two fan-outs over the same sessions queue
//! rather than deadlock), checked on what is locked; each recipient's
//! message, the request id, the audit entry, and the message events last.
//! A group's row is locked by whoever changes its members, so concurrent
//! additions count its size one after the other.

use sqlx::PgConnection;

use super::{
    PgStore, events,
    open::{RawSession, session_columns},
    sessions::{insert_body, insert_entry},
};
use crate::store::groups::postgres::{member_ids, member_of};
use crate::{
    error::SessionError,
    model::{
        Audience, AuditRecord, FannedOut, Idempotency, MessageRate, NewMessage, Reach, Reached,
        SessionRow, new_message_id,
    },
    store::{
        Bounds, FanOut, FanOutCheck,
        shared::{Unread, fan_out_record, fill_inboxes, replayed_fan_out},
    },
};

impl PgStore {
    pub(in crate::store) async fn fan_out_once(
        &self,
        out: &FanOut,
        idem: Option<&Idempotency>,
        audit: &AuditRecord,
        bounds: Bounds<'_>,
        check: FanOutCheck<'_>,
    ) -> Result<FannedOut, SessionError> {
        let mut tx = self.begin().await?;
        if let Some(idem) = idem
            && let Some(result) = events::claim(&mut tx, idem).await?
        {
            return replayed_fan_out(&result);
        }
        let rate = match bounds.throttle {
            Some(t) => Some(lock_rate(&mut tx, t.sender).await?),
            None => None,
        };
        let ids = candidate_ids(&mut tx, &out.audience).await?;
        let rows = lock_sessions(&mut tx, &ids).await?;
        let mut plan = check(&rows)?;
        let unread = unread_bytes(&mut tx, &ids).await?;
        let sending = fill_inboxes(&mut plan, &unread, &out.body, bounds.inbox);
        if let (Some(t), Some(rate)) = (bounds.throttle, rate) {
            let new_rate = (t.check)(rate, sending)?;
            set_rate(&mut tx, t.sender, new_rate).await?;
        }
        let mut reached = Vec::with_capacity(plan.len());
        let mut written = Vec::new();
        // The body once, under the first recipient's message id.
        let mut body_id: Option<String> = None;
        for (session_id, reach) in plan {
            match reach {
                Reach::Deliver => {
                    let message = NewMessage {
                        message_id: new_message_id(),
                        sender: out.sender.clone(),
                        body: out.body.clone(),
                    };
                    let body_id = match &body_id {
                        Some(id) => id,
                        None => {
                            insert_body(&mut tx, &message.message_id, &out.body).await?;
                            body_id.insert(message.message_id.clone())
                        }
                    };
                    let sequence = insert_entry(&mut tx, &session_id, &message, body_id).await?;
                    let status = rows
                        .iter()
                        .find(|r| r.session_id == session_id)
                        .map(|r| r.status)
                        .unwrap_or_default();
                    written.push(crate::store::journal::NewEvent::message(
                        &session_id,
                        status,
                        &message.message_id,
                        sequence,
                        &message.body,
                    ));
                    reached.push(Reached::Delivered {
                        session_id,
                        message_id: message.message_id,
                        sequence: sequence as u64,
                    });
                }
                Reach::Ended => reached.push(Reached::Ended { session_id }),
                Reach::InboxFull => reached.push(Reached::InboxFull { session_id }),
                Reach::Hidden => {}
            }
        }
        let record = fan_out_record(&reached);
        let mut audit = audit.clone();
        audit.detail = record.to_string();
        events::remember(&mut tx, idem, record).await?;
        PgStore::insert_audit(&mut tx, &audit).await?;
        events::write(&mut tx, &written, false).await?;
        tx.commit().await?;
        self.published(false);
        Ok(FannedOut {
            reached,
            replayed: false,
        })
    }
}

/// Locks a session's message rate row (made at zero if it has none) and
/// returns its state.
pub(super) async fn lock_rate(
    conn: &mut PgConnection,
    session_id: &str,
) -> Result<MessageRate, SessionError> {
    let (messages_tat_ms, bytes_tat_ms): (i64, i64) = sqlx::query_as(
        "INSERT INTO message_rates (session_id, tat_ms) VALUES ($1, 0) \
         ON CONFLICT (session_id) DO UPDATE SET tat_ms = message_rates.tat_ms \
         RETURNING tat_ms, bytes_tat_ms",
    )
    .bind(session_id)
    .fetch_one(conn)
    .await?;
    Ok(MessageRate {
        messages_tat_ms,
        bytes_tat_ms,
    })
}

/// Sets a locked message rate row.
pub(super) async fn set_rate(
    conn: &mut PgConnection,
    session_id: &str,
    rate: MessageRate,
) -> Result<(), SessionError> {
    sqlx::query("UPDATE message_rates SET tat_ms = $2, bytes_tat_ms = $3 WHERE session_id = $1")
        .bind(session_id)
        .bind(rate.messages_tat_ms)
        .bind(rate.bytes_tat_ms)
        .execute(conn)
        .await?;
    Ok(())
}

/// The bytes each of `ids`' inboxes holds not yet delivered (their rows
/// locked by the caller).
pub(super) async fn unread_bytes(
    conn: &mut PgConnection,
    ids: &[String],
) -> Result<Unread, SessionError> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT session_id, unread_bytes FROM sessions WHERE session_id = ANY($1)")
            .bind(ids)
            .fetch_all(conn)
            .await?;
    Ok(rows
        .into_iter()
        .map(|(id, bytes)| (id, bytes.max(0) as u64))
        .collect())
}

/// The ids of an audience's candidate recipients, in the order they are
/// answered.
async fn candidate_ids(
    conn: &mut PgConnection,
    audience: &Audience,
) -> Result<Vec<String>, SessionError> {
    let active = "status IN ('pending', 'running')";
    let query = match audience {
        Audience::Workspace(workspace_id) => sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT session_id FROM sessions WHERE workspace_id = $1 AND {active} \
             ORDER BY row_id"
        )))
        .bind(workspace_id.clone()),
        Audience::Subtree(root) => sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "WITH RECURSIVE down(session_id, depth, row_id, status) AS ( \
               SELECT session_id, depth, row_id, status FROM sessions WHERE parent_session_id = $1 \
               UNION ALL \
               SELECT s.session_id, s.depth, s.row_id, s.status \
               FROM sessions s JOIN down ON s.parent_session_id = down.session_id) \
             SELECT session_id FROM down WHERE {active} ORDER BY depth, row_id"
        )))
        .bind(root.clone()),
        Audience::Children(parent) => sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT session_id FROM sessions WHERE parent_session_id = $1 AND {active} \
             ORDER BY row_id"
        )))
        .bind(parent.clone()),
        Audience::Group {
            workspace_id,
            name,
            poster,
        } => {
            let found = member_of(conn, workspace_id, name, poster, false).await?;
            let mut ids = member_ids(conn, &found.group_id).await?;
            ids.retain(|id| id != poster);
            return Ok(ids);
        }
    };
    Ok(query.fetch_all(conn).await?)
}

/// Locks the sessions of `ids` (in id order) and returns their rows in the
/// order of `ids`.
async fn lock_sessions(
    conn: &mut PgConnection,
    ids: &[String],
) -> Result<Vec<SessionRow>, SessionError> {
    let raws: Vec<RawSession> = sqlx::query_as(concat!(
        "SELECT ",
        session_columns!(),
        " FROM sessions WHERE session_id = ANY($1) ORDER BY session_id FOR NO KEY UPDATE"
    ))
    .bind(ids)
    .fetch_all(conn)
    .await?;
    super::reads::in_order(raws, ids)
}
