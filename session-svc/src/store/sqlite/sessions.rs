//! The session write paths: creating a root or a child session, sending a
//! message (ends are written once, in `store::ends`). Each checks its rule
//! inside its transaction, against the ledger, and puts its results in the
//! ledger after the commit.

use super::{
    SqliteStore, groups,
    writer::{Begun, first_i64},
};
use crate::{
    error::SessionError,
    model::{AuditRecord, Idempotency, NewMessage, NewSession, Sending, now_ms},
    policy::{self, SpawnContext},
    store::{
        Bounds, Created, MessageCheck, RootCheck, Sent, SpawnCheck,
        accounts::stored_budget,
        shared::{create_record, replayed_create, replayed_sent, sent_record},
    },
};

impl SqliteStore {
    pub(in crate::store) async fn create_root_once(
        &self,
        new: &NewSession,
        idem: Option<&Idempotency>,
        audit: &AuditRecord,
        check: RootCheck<'_>,
    ) -> Result<Created, SessionError> {
        let mut w = self.writer().await?;
        let mut batch = match self.begin(&mut w, idem).await? {
            Begun::Replay(result) => return replayed_create(&result),
            Begun::Batch(batch) => batch,
        };
        let quota = check(self.ledger().active_in_workspace(&new.workspace_id));
        let quota = w.or_abandon(quota).await?;
        let limits = w.or_abandon(stored_budget(&new.budget)).await?;
        let tree_id = format!("tree_{}", uuid::Uuid::now_v7().simple());
        batch
            .remember(idem, create_record(&new.session_id, &quota))
            .insert_session(new, None, &tree_id, 0)
            .account(
                &new.session_id,
                0,
                limits,
                policy::deadline(&new.budget, &[], now_ms()),
            )
            .audit(audit);
        let session = self.commit_create(&mut w, batch, new, None).await?;
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
        let mut w = self.writer().await?;
        let mut batch = match self.begin(&mut w, idem).await? {
            Begun::Replay(result) => return replayed_create(&result),
            Begun::Batch(batch) => batch,
        };
        let facts = self
            .ledger()
            .spawn_facts(parent_id)
            .ok_or_else(|| SessionError::not_found(parent_id));
        let facts = w.or_abandon(facts).await?;
        let accounts = crate::store::budgets::sqlite::path(&mut w.conn, parent_id, false).await;
        let accounts = w.or_abandon(accounts).await?;
        let limits = w.or_abandon(stored_budget(&new.budget)).await?;
        let admission = check(&SpawnContext {
            parent: &facts.parent,
            tree_sessions: facts.tree_sessions,
            tree_sandboxed: facts.tree_sandboxed,
            children: facts.children,
            workspace_active: facts.workspace_active,
            accounts: &accounts,
            budget: &new.budget,
            now_ms: now_ms(),
        });
        let admission = w.or_abandon(admission).await?;
        let parent = &facts.parent;
        batch.remember(idem, create_record(&new.session_id, &admission.quota));
        let tat = (admission.parent_spawn_tat_ms != parent.spawn_tat_ms)
            .then_some(admission.parent_spawn_tat_ms);
        if let Some(tat) = tat {
            batch.set_spawn_tat(&parent.session_id, tat);
        }
        batch
            .insert_session(new, Some(parent), &parent.tree_id, admission.depth)
            .account(
                &new.session_id,
                admission.depth,
                limits,
                admission.deadline_ms,
            )
            .audit(audit);
        let session = self
            .commit_create(
                &mut w,
                batch,
                new,
                tat.map(|t| (parent.session_id.as_str(), t)),
            )
            .await?;
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
        let mut w = self.writer().await?;
        let mut batch = match self.begin(&mut w, idem).await? {
            Begun::Replay(result) => {
                return replayed_sent(&result);
            }
            Begun::Batch(batch) => batch,
        };
        let target = self
            .ledger()
            .get(recipient)
            .ok_or_else(|| SessionError::not_found(recipient));
        let target = w.or_abandon(target).await?;
        let checked = check(&target);
        w.or_abandon(checked).await?;
        let recipient_id = std::slice::from_ref(&target.session_id);
        let unread = groups::unread_bytes(&mut w.conn, recipient_id).await;
        let unread = w.or_abandon(unread).await?;
        let held = unread.get(&target.session_id).copied().unwrap_or(0);
        let room = (bounds.inbox)(held, message.body.len() as u64);
        w.or_abandon(room).await?;
        if let Some(throttle) = bounds.throttle {
            let rate = groups::message_rate(&mut w.conn, throttle.sender).await;
            let rate = w.or_abandon(rate).await?;
            let admitted = (throttle.check)(rate, Sending::to_each(1, &message.body));
            let new_rate = w.or_abandon(admitted).await?;
            if new_rate != rate {
                batch.set_message_rate(throttle.sender, new_rate);
            }
        }
        // The sequence the message will get: the ledger holds the committed
        // inbox_seq and nothing else writes it.
        let sequence = target.inbox_seq as u64 + 1;
        batch
            .remember(idem, sent_record(&message.message_id, sequence))
            .message(&target.session_id, message, sequence)
            .audit(audit);
        w.unsettled = vec![target.session_id.clone()];
        let rows = self.run_batch(&mut w, batch).await?;
        let stored = first_i64(&rows)? as u64;
        if stored != sequence {
            return Err(SessionError::Internal(format!(
                "inbox sequence {stored} stored where {sequence} was expected"
            )));
        }
        self.ledger_mut()
            .update(recipient, |row| row.inbox_seq = sequence as i64);
        w.unsettled.clear();
        drop(w);
        self.published();
        Ok(Sent {
            message_id: message.message_id.clone(),
            sequence,
            replayed: false,
        })
    }
}
