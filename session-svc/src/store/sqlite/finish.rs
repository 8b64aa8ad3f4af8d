//! A session's own end (`FinishSession`): its result stored, its end, its
//! subtree terminated as a termination's is, its callback and its stop.
//! The result lives in `sessions.outcome` and `result`, read apart from the
//! row (`Store::finished`): the ledger does not hold it.

use serde_json::json;
use troupe_proto::session::SessionStatus;

use super::{SqliteStore, parent_end, write::Write};
use crate::{
    error::SessionError,
    model::{AuditRecord, EventKind, Finish, Principal, SessionRow},
    store::MessageCheck,
};

impl SqliteStore {
    pub(super) async fn finish_impl(
        &self,
        session_id: &str,
        finish: &Finish,
        stop_after_ms: i64,
        audit: AuditRecord,
        check: MessageCheck<'_>,
    ) -> Result<(Vec<String>, SessionRow), SessionError> {
        let mut w = self.writer().await?;
        let (row, subtree) = {
            let ledger = self.ledger();
            let row = ledger
                .get(session_id)
                .ok_or_else(|| SessionError::not_found(session_id))?;
            (row, ledger.active_subtree(session_id))
        };
        check(&row)?;
        let members = self.members_below(session_id);
        w.unsettled = subtree.clone();
        let mut tx = Write::begin(&mut w.conn).await?;
        let status = finish.outcome.status();
        let mut ended = Vec::with_capacity(subtree.len());
        let own = tx
            .end_session(session_id, status, Finish::END_REASON)
            .await?;
        sqlx::query("UPDATE sessions SET outcome = ?2, result = ?3 WHERE session_id = ?1")
            .bind(session_id)
            .bind(finish.outcome.as_str())
            .bind(&finish.result)
            .execute(tx.conn())
            .await?;
        let kind = match status {
            SessionStatus::Completed => EventKind::Completed,
            _ => EventKind::Failed,
        };
        tx.event(session_id, kind, status, finish.event_detail())
            .await?;
        // The parent hears of the end now, with the result; the exit that
        // follows finds the notice written (its guard) and adds none.
        sqlx::query(
            "UPDATE processes SET callback_due = notify_parent, stop_after_ms = ?2 \
             WHERE session_id = ?1",
        )
        .bind(session_id)
        .bind(stop_after_ms)
        .execute(tx.conn())
        .await?;
        let by = Principal::Session(session_id.to_owned());
        let mut terminated = Vec::new();
        if let Some(entry) = own {
            let (below, applied) = parent_end::apply(&mut tx, &entry.1, &members, &by).await?;
            terminated = applied.terminated;
            ended.push(entry);
            ended.extend(below);
        }
        let mut audit = audit;
        audit.detail =
            json!({"outcome": finish.outcome.as_str(), "result_bytes": finish.result.len(),
                              "terminated": terminated})
            .to_string();
        tx.audit(&audit).await?;
        tx.commit().await?;
        let row = {
            let mut ledger = self.ledger_mut();
            for (rowid, row) in ended {
                ledger.put(rowid, row);
            }
            ledger.get(session_id).unwrap_or(row)
        };
        w.unsettled.clear();
        drop(w);
        self.published();
        Ok((terminated, row))
    }

    pub(super) async fn finished_impl(
        &self,
        session_id: &str,
    ) -> Result<Option<Finish>, SessionError> {
        let stored: Option<(Option<String>, Option<String>)> =
            sqlx::query_as("SELECT outcome, result FROM sessions WHERE session_id = ?")
                .bind(session_id)
                .fetch_optional(&self.pool)
                .await?;
        match stored {
            Some((outcome, result)) => Finish::stored(outcome, result),
            None => Ok(None),
        }
    }
}
