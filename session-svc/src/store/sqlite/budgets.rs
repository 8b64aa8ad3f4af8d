//! Budgets and usage on SQLite: reservations, settlements, stale
//! reservations released, accounts read, and the sessions whose wall-clock
//! budget ran out. The one writer makes each reservation atomic across the
//! session's path: nothing else writes between its check and its write.

use serde_json::json;
use troupe_proto::session::SessionStatus;

use super::{SqliteStore, lease, write::Write};
use crate::{
    error::SessionError,
    model::{AuditRecord, EventKind, ExitReason, Principal},
};

impl SqliteStore {
    pub(super) async fn end_for_budget_impl(
        &self,
        fence: &crate::store::Fence,
        session_id: &str,
        audit: AuditRecord,
    ) -> Result<Vec<String>, SessionError> {
        let mut w = self.writer().await?;
        let subtree = {
            let ledger = self.ledger();
            match ledger.get(session_id) {
                Some(row) if row.is_active() => ledger.active_subtree(session_id),
                _ => return Ok(Vec::new()),
            }
        };
        w.unsettled = subtree.clone();
        let mut tx = Write::begin(&mut w.conn).await?;
        lease::check(tx.conn(), fence).await?;
        let reason = ExitReason::Budget.as_str();
        let mut ended = Vec::with_capacity(subtree.len());
        for id in &subtree {
            if let Some(entry) = tx
                .end_session(id, SessionStatus::Terminated, reason)
                .await?
            {
                tx.event(
                    id,
                    EventKind::Terminated,
                    SessionStatus::Terminated,
                    json!({"reason": reason, "terminated_by": Principal::Troupe.to_string()}),
                )
                .await?;
                ended.push(entry);
            }
        }
        let ids: Vec<String> = ended.iter().map(|(_, r)| r.session_id.clone()).collect();
        let mut audit = audit;
        audit.detail = json!({"terminated": ids}).to_string();
        tx.audit(&audit).await?;
        tx.commit().await?;
        {
            let mut ledger = self.ledger_mut();
            for (rowid, row) in ended {
                ledger.put(rowid, row);
            }
        }
        w.unsettled.clear();
        drop(w);
        self.published();
        Ok(ids)
    }
}
