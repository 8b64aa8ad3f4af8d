//! Messages to many and named groups on SQLite: a fan-out is one batch
//! (every recipient's message, the sender's rate state, the request id and
//! the audit entry), its candidates read from the ledger (sessions) and the
//! writer's connection (groups) under the writer lock, so nothing changes
//! between the check and the commit.

use sqlx::{Row, SqliteConnection};

use super::{SqliteStore, writer::Begun};
use crate::store::groups::sqlite::{member_ids, member_of};
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

impl SqliteStore {
    pub(in crate::store) async fn fan_out_once(
        &self,
        out: &FanOut,
        idem: Option<&Idempotency>,
        audit: &AuditRecord,
        bounds: Bounds<'_>,
        check: FanOutCheck<'_>,
    ) -> Result<FannedOut, SessionError> {
        let mut w = self.writer().await?;
        let mut batch = match self.begin(&mut w, idem).await? {
            Begun::Replay(result) => return replayed_fan_out(&result),
            Begun::Batch(batch) => batch,
        };
        let candidates = self.candidates(&mut w.conn, &out.audience).await;
        let candidates = w.or_abandon(candidates).await?;
        let plan = check(&candidates);
        let mut plan = w.or_abandon(plan).await?;
        let recipients: Vec<String> = plan
            .iter()
            .filter(|(_, reach)| *reach == Reach::Deliver)
            .map(|(id, _)| id.clone())
            .collect();
        let unread = unread_bytes(&mut w.conn, &recipients).await;
        let unread = w.or_abandon(unread).await?;
        let sending = fill_inboxes(&mut plan, &unread, &out.body, bounds.inbox);
        if let Some(throttle) = bounds.throttle {
            let rate = message_rate(&mut w.conn, throttle.sender).await;
            let rate = w.or_abandon(rate).await?;
            let admitted = (throttle.check)(rate, sending);
            let new_rate = w.or_abandon(admitted).await?;
            if new_rate != rate {
                batch.set_message_rate(throttle.sender, new_rate);
            }
        }
        let mut reached = Vec::with_capacity(plan.len());
        // The body once, under the first recipient's message id.
        let mut body_id: Option<String> = None;
        for (session_id, reach) in plan {
            match reach {
                Reach::Deliver => {
                    let sequence = candidates
                        .iter()
                        .find(|row| row.session_id == session_id)
                        .map_or(0, |row| row.inbox_seq as u64 + 1);
                    let message = NewMessage {
                        message_id: new_message_id(),
                        sender: out.sender.clone(),
                        body: out.body.clone(),
                    };
                    let body_id = match &body_id {
                        Some(id) => id,
                        None => {
                            batch.body(&message.message_id, &out.body);
                            body_id.insert(message.message_id.clone())
                        }
                    };
                    batch.entry(&session_id, &message, body_id, sequence);
                    reached.push(Reached::Delivered {
                        session_id,
                        message_id: message.message_id,
                        sequence,
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
        batch.remember(idem, record).audit(&audit);
        let delivered: Vec<(&str, u64)> = reached
            .iter()
            .filter_map(|r| match r {
                Reached::Delivered {
                    session_id,
                    sequence,
                    ..
                } => Some((session_id.as_str(), *sequence)),
                Reached::Ended { .. } | Reached::InboxFull { .. } => None,
            })
            .collect();
        w.unsettled = delivered.iter().map(|(id, _)| (*id).to_owned()).collect();
        let rows = self.run_batch(&mut w, batch).await?;
        let stored: Vec<i64> = rows
            .iter()
            .map(|row| row.try_get::<i64, _>(0))
            .collect::<Result<_, _>>()?;
        let expected: Vec<i64> = delivered.iter().map(|(_, seq)| *seq as i64).collect();
        if stored != expected {
            return Err(SessionError::Internal(format!(
                "inbox sequences {stored:?} stored where {expected:?} were expected"
            )));
        }
        {
            let mut ledger = self.ledger_mut();
            for (id, seq) in &delivered {
                ledger.update(id, |row| row.inbox_seq = *seq as i64);
            }
        }
        w.unsettled.clear();
        drop(w);
        self.published();
        Ok(FannedOut {
            reached,
            replayed: false,
        })
    }

    /// The candidate recipients of an audience, as the ledger has them.
    async fn candidates(
        &self,
        conn: &mut SqliteConnection,
        audience: &Audience,
    ) -> Result<Vec<SessionRow>, SessionError> {
        let ledger_rows = |ids: Vec<String>| -> Vec<SessionRow> {
            let ledger = self.ledger();
            ids.iter().filter_map(|id| ledger.get(id)).collect()
        };
        Ok(match audience {
            Audience::Workspace(workspace_id) => {
                let (rows, _) = self.ledger().list(workspace_id, false, false, 0, u32::MAX);
                rows.iter().map(|row| SessionRow::clone(row)).collect()
            }
            Audience::Subtree(root) => {
                let mut ids = self.ledger().active_subtree(root);
                ids.retain(|id| id != root);
                ledger_rows(ids)
            }
            Audience::Children(parent) => {
                let mut rows = self.ledger().children(parent);
                rows.retain(SessionRow::is_active);
                rows
            }
            Audience::Group {
                workspace_id,
                name,
                poster,
            } => {
                let group = member_of(conn, workspace_id, name, poster, false).await?;
                let mut ids = member_ids(conn, &group.group_id).await?;
                ids.retain(|id| id != poster);
                ledger_rows(ids)
            }
        })
    }
}

/// A session's message rate state (zeros: it has sent nothing yet).
pub(super) async fn message_rate(
    conn: &mut SqliteConnection,
    session_id: &str,
) -> Result<MessageRate, SessionError> {
    let tats: Option<(i64, i64)> =
        sqlx::query_as("SELECT tat_ms, bytes_tat_ms FROM message_rates WHERE session_id = ?")
            .bind(session_id)
            .fetch_optional(conn)
            .await?;
    Ok(
        tats.map_or_else(MessageRate::default, |(messages, bytes)| MessageRate {
            messages_tat_ms: messages,
            bytes_tat_ms: bytes,
        }),
    )
}

/// The bytes each of `ids`' inboxes holds not yet delivered, in one query.
pub(super) async fn unread_bytes(
    conn: &mut SqliteConnection,
    ids: &[String],
) -> Result<Unread, SessionError> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT session_id, unread_bytes FROM sessions \
         WHERE session_id IN (SELECT value FROM json_each(?1))",
    )
    .bind(serde_json::Value::from(ids).to_string())
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, bytes)| (id, bytes.max(0) as u64))
        .collect())
}
