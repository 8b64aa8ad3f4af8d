//! Messages, written once for both backends (see `backends`): one to a
//! session, one to many (a fan-out: an audience, a group), and a child's
//! callback notice to its parent. Each is one `Batched` transaction: the
//! request id's claim, the sender's rate state (on PostgreSQL its row,
//! locked before any session row), the recipients' rows (locked in id
//! order on PostgreSQL; the ledger on SQLite), the rules, then each
//! recipient's message, the rate state, the request id, the audit entry
//! and the message events last. A message's sequence is its recipient's
//! next, read from the row the transaction holds; the backend checks that
//! the inbox gave it.

use std::future::Future;

use super::{Bounds, FanOut, FanOutCheck, Fence, MessageCheck, Sent, backends::each_backend};
use crate::{
    error::SessionError,
    model::{AuditRecord, FannedOut, Idempotency, NewMessage, SessionId},
};

/// Stores a message's body once: its id, its text.
pub(crate) const INSERT_BODY: &str = "INSERT INTO message_bodies (body_id, body) VALUES ($1, $2)";

/// Messages between sessions; every [`super::Store`] is one.
pub trait MessageStore: Send + Sync {
    /// Appends a message to `recipient`'s inbox if `check` allows it, the
    /// recipient's inbox takes its bytes and, with a throttle, its sender's
    /// rates do (the rate state updated in the same transaction). Its body
    /// is stored once, beside the inbox entry.
    fn send_message(
        &self,
        recipient: &SessionId,
        message: NewMessage,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        bounds: Bounds<'_>,
        check: MessageCheck<'_>,
    ) -> impl Future<Output = Result<Sent, SessionError>> + Send;

    /// Stores one message to many in one transaction: resolves the
    /// audience's candidates (their rows), lets `check` plan who gets it,
    /// leaves out those whose inbox is full (`bounds.inbox`), counts the
    /// rest against the throttle's rates, stores the body once and appends
    /// a message (its own id, the recipient's next inbox sequence, its
    /// event) to each inbox, with `audit` (its detail: who got what). A group audience's
    /// poster must be a member, else GROUP_NOT_FOUND. With a request id, a
    /// retry replays the whole answer.
    fn fan_out(
        &self,
        out: &FanOut,
        idem: Option<Idempotency>,
        audit: AuditRecord,
        bounds: Bounds<'_>,
        check: FanOutCheck<'_>,
    ) -> impl Future<Output = Result<FannedOut, SessionError>> + Send;

    /// Writes the callback notice `message` into the parent's inbox of the
    /// ended session `child_id`, if it is due, and clears it, in one
    /// transaction (with the request-id guard: action `callback`, the
    /// child's id). Returns the message written, or `None` if it was not
    /// due or the parent has ended (then it is cleared all the same).
    fn write_callback(
        &self,
        fence: &Fence,
        child_id: &SessionId,
        message: NewMessage,
        audit: AuditRecord,
    ) -> impl Future<Output = Result<Option<Sent>, SessionError>> + Send;
}

each_backend! {
    use crate::{
        error::SessionError,
        model::{SessionId,
            Audience, AuditRecord, FannedOut, Idempotency, NewMessage, Reach, Reached, Sending,
            SessionRow, new_message_id,
        },
        {
            Bounds, FanOut, FanOutCheck, Fence, MessageCheck, Sent,
            journal::NewEvent,
            lease::callback_guard,
            shared::{
                fan_out_record, fill_inboxes, json_ids, replayed_fan_out, replayed_sent,
                sent_record, Unread,
            },
        },
    };

    impl MessageStore for This {
        async fn send_message(
            &self,
            recipient: &SessionId,
            message: NewMessage,
            idem: Option<Idempotency>,
            audit: AuditRecord,
            bounds: Bounds<'_>,
            check: MessageCheck<'_>,
        ) -> Result<Sent, SessionError> {
            let idem = idem.as_ref();
            let (message, audit) = (&message, &audit);
            retrying!(async {
                let mut tx = self.batched().await?;
                if let Some(idem) = idem
                    && let Some(result) = tx.claim(idem).await?
                {
                    return replayed_sent(&result);
                }
                let rate = match bounds.throttle {
                    Some(t) => Some(tx.rate(t.sender).await?),
                    None => None,
                };
                let target = tx.lock_row(recipient).await?;
                check(&target)?;
                let unread = unread_bytes(tx.conn(), std::slice::from_ref(&target.session_id)).await?;
                let held = unread.get(&target.session_id).copied().unwrap_or(0);
                (bounds.inbox)(held, message.body.len() as u64)?;
                if let (Some(t), Some(rate)) = (bounds.throttle, rate) {
                    let new_rate = (t.check)(rate, Sending::to_each(1, &message.body))?;
                    tx.set_rate(t.sender, rate, new_rate).await?;
                }
                let (sequence, event) = tx.deliver_new(&target, message).await?;
                tx.remember(idem, sent_record(&message.message_id, sequence)).await?;
                tx.audit(audit).await?;
                tx.events(&[event]).await?;
                tx.commit().await?;
                self.committed(false);
                Ok(Sent {
                    message_id: message.message_id.clone(),
                    sequence,
                    replayed: false,
                })
            })
        }

        /// The body is stored once, under the
        /// first recipient's message id.
        async fn fan_out(
            &self,
            out: &FanOut,
            idem: Option<Idempotency>,
            audit: AuditRecord,
            bounds: Bounds<'_>,
            check: FanOutCheck<'_>,
        ) -> Result<FannedOut, SessionError> {
            let (idem, audit) = (idem.as_ref(), &audit);
            retrying!(async {
                let mut tx = self.batched().await?;
                if let Some(idem) = idem
                    && let Some(result) = tx.claim(idem).await?
                {
                    return replayed_fan_out(&result);
                }
                let rate = match bounds.throttle {
                    Some(t) => Some(tx.rate(t.sender).await?),
                    None => None,
                };
                let ids = match &out.audience {
                    Audience::Group { workspace_id, name, poster } => {
                        This::audience_of_post(tx.conn(), workspace_id, name, poster).await?
                    }
                    audience => tx.audience(audience).await?,
                };
                let rows = tx.lock_rows(&ids).await?;
                let mut plan = check(&rows)?;
                let unread = unread_bytes(tx.conn(), &ids).await?;
                let sending = fill_inboxes(&mut plan, &unread, &out.body, bounds.inbox);
                if let (Some(t), Some(rate)) = (bounds.throttle, rate) {
                    let new_rate = (t.check)(rate, sending)?;
                    tx.set_rate(t.sender, rate, new_rate).await?;
                }
                let mut reached = Vec::with_capacity(plan.len());
                let mut events = Vec::new();
                let mut body_id: Option<String> = None;
                for (session_id, reach) in plan {
                    let target = match reach {
                        Reach::Deliver => rows.iter().find(|r| r.session_id == session_id),
                        Reach::Ended => {
                            reached.push(Reached::Ended { session_id });
                            continue;
                        }
                        Reach::InboxFull => {
                            reached.push(Reached::InboxFull { session_id });
                            continue;
                        }
                        Reach::Hidden => continue,
                    };
                    let Some(target) = target else { continue };
                    let message = NewMessage {
                        message_id: new_message_id(),
                        sender: out.sender.clone(),
                        body: out.body.clone(),
                    };
                    let body_id = match &body_id {
                        Some(id) => id,
                        None => {
                            tx.body(&message.message_id, &out.body).await?;
                            body_id.insert(message.message_id.clone())
                        }
                    };
                    let (sequence, event) = tx.deliver(target, &message, body_id).await?;
                    events.push(event);
                    reached.push(Reached::Delivered {
                        session_id,
                        message_id: message.message_id,
                        sequence,
                    });
                }
                let record = fan_out_record(&reached);
                let mut audit = audit.clone();
                audit.detail = record.to_string();
                tx.remember(idem, record).await?;
                tx.audit(&audit).await?;
                tx.events(&events).await?;
                tx.commit().await?;
                self.committed(false);
                Ok(FannedOut {
                    reached,
                    replayed: false,
                })
            })
        }

        /// The notice of `child_id`'s
        /// end to its parent, once per child ever (`callback_guard`). One
        /// not due does nothing; one due with nobody to tell, or answered
        /// before, is only cleared.
        async fn write_callback(
            &self,
            fence: &Fence,
            child_id: &SessionId,
            message: NewMessage,
            audit: AuditRecord,
        ) -> Result<Option<Sent>, SessionError> {
            let (message, audit) = (&message, &audit);
            retrying!(async {
                let mut tx = self.batched().await?;
                This::check_fence(tx.conn(), fence).await?;
                let idem = callback_guard(child_id);
                if tx.claim(&idem).await?.is_some() {
                    drop(tx);
                    self.clear_callback(fence, child_id).await?;
                    return Ok(None);
                }
                let due: Option<bool> =
                    sqlx::query_scalar("SELECT callback_due FROM processes WHERE session_id = $1")
                        .bind(child_id)
                        .fetch_optional(tx.conn())
                        .await?;
                if due != Some(true) {
                    return Ok(None);
                }
                let parent = self.row_of(tx.conn(), child_id).await?.parent_session_id;
                let target = match parent {
                    Some(parent) => Some(tx.lock_row(&parent).await?),
                    None => None,
                };
                let Some(target) = target.filter(SessionRow::is_active) else {
                    drop(tx);
                    self.clear_callback(fence, child_id).await?;
                    return Ok(None);
                };
                let (sequence, event) = tx.deliver_new(&target, message).await?;
                tx.clear_callback(child_id).await?;
                tx.remember(Some(&idem), sent_record(&message.message_id, sequence)).await?;
                tx.audit(audit).await?;
                tx.events(&[event]).await?;
                tx.commit().await?;
                self.committed(false);
                Ok(Some(Sent {
                    message_id: message.message_id.clone(),
                    sequence,
                    replayed: false,
                }))
            })
        }
    }

    impl Batched<'_> {
        /// Appends `message` to `target`'s inbox as its next message, its
        /// body stored with it; returns its sequence and its event.
        pub(crate) async fn deliver_new(
            &mut self,
            target: &SessionRow,
            message: &NewMessage,
        ) -> Result<(u64, NewEvent), SessionError> {
            self.body(&message.message_id, &message.body).await?;
            self.deliver(target, message, &message.message_id).await
        }

        /// Appends `message` to `target`'s inbox as its next message, its
        /// body the one stored under `body_id`; returns its sequence and its
        /// event.
        async fn deliver(
            &mut self,
            target: &SessionRow,
            message: &NewMessage,
            body_id: &str,
        ) -> Result<(u64, NewEvent), SessionError> {
            let sequence = target.inbox_seq + 1;
            self.entry(&target.session_id, message, body_id, sequence).await?;
            let event = NewEvent::message(
                &target.session_id,
                target.status,
                &message.message_id,
                sequence,
                &message.body,
            );
            Ok((sequence as u64, event))
        }
    }

    /// The bytes each of `ids`' inboxes holds not yet delivered.
    async fn unread_bytes(conn: &mut Conn, ids: &[SessionId]) -> Result<Unread, SessionError> {
        let rows: Vec<(SessionId, i64)> = sqlx::query_as(concat!(
            "SELECT session_id, unread_bytes FROM sessions WHERE session_id ",
            any_of!(1)
        ))
        .bind(json_ids(ids.iter().map(SessionId::as_str)))
        .fetch_all(conn)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(id, bytes)| (id, bytes.max(0) as u64))
            .collect())
    }

    impl This {

        /// Clears a callback that has nobody to tell or was answered
        /// before.
        async fn clear_callback(&self, fence: &Fence, child_id: &str) -> Result<(), SessionError> {
            let mut tx = self.tx().await?;
            This::check_fence(tx.conn(), fence).await?;
            sqlx::query("UPDATE processes SET callback_due = FALSE WHERE session_id = $1")
                .bind(child_id)
                .execute(tx.conn())
                .await?;
            tx.commit().await
        }
    }
}
