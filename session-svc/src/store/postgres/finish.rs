//! A session's own end (`FinishSession`), in one transaction that locks as
//! a termination does (workspace, tree, session rows) and writes its events
//! last (see `events`).

use serde_json::json;
use troupe_proto::session::SessionStatus;

use super::{
    PgStore,
    events::{self, NewEvent},
    locks, parent_end,
};
use crate::{
    error::SessionError,
    model::{AuditRecord, EventKind, Finish, Principal, SessionRow},
    store::MessageCheck,
};

impl PgStore {
    pub(super) async fn finish_once(
        &self,
        session_id: &str,
        finish: &Finish,
        stop_after_ms: i64,
        audit: &AuditRecord,
        check: MessageCheck<'_>,
    ) -> Result<(Vec<String>, SessionRow), SessionError> {
        let mut tx = self.begin().await?;
        // The workspace and tree first: from here on no spawn can commit
        // under the subtree, and one committed before is seen below.
        locks::place_of(&mut tx, session_id).await?;
        let (row, _) = locks::session(&mut tx, session_id).await?;
        check(&row)?;
        let status = finish.outcome.status();
        let mut ended = locks::end_sessions(
            &mut tx,
            &[session_id.to_owned()],
            status,
            session_id,
            Finish::END_REASON,
            Finish::END_REASON,
        )
        .await?;
        sqlx::query("UPDATE sessions SET outcome = $2, result = $3 WHERE session_id = $1")
            .bind(session_id)
            .bind(finish.outcome.as_str())
            .bind(&finish.result)
            .execute(&mut *tx)
            .await?;
        // The parent hears of the end now, with the result; the exit that
        // follows finds the notice written (its guard) and adds none.
        sqlx::query(
            "UPDATE processes SET callback_due = notify_parent, stop_after_ms = $2 \
             WHERE session_id = $1",
        )
        .bind(session_id)
        .bind(stop_after_ms)
        .execute(&mut *tx)
        .await?;
        let by = Principal::Session(session_id.to_owned());
        let reached = match ended.first() {
            Some(own) => Some(parent_end::apply(&mut tx, own, &by).await?),
            None => None,
        };
        let terminated = reached
            .as_ref()
            .map(|r| r.applied.terminated.clone())
            .unwrap_or_default();
        let mut audit = audit.clone();
        audit.detail =
            json!({"outcome": finish.outcome.as_str(), "result_bytes": finish.result.len(),
                              "terminated": terminated})
            .to_string();
        PgStore::insert_audit(&mut tx, &audit).await?;
        let kind = match status {
            SessionStatus::Completed => EventKind::Completed,
            _ => EventKind::Failed,
        };
        let mut new_events = vec![NewEvent::new(
            session_id,
            kind,
            status,
            finish.event_detail(),
        )];
        let mut cascaded = Vec::new();
        if let Some(reached) = reached {
            new_events.extend(reached.events);
            cascaded = reached.rows;
        }
        events::write(&mut tx, &new_events, true).await?;
        tx.commit().await?;
        ended.append(&mut cascaded);
        let row = ended
            .into_iter()
            .find(|r| r.session_id == session_id)
            .unwrap_or(row);
        Ok((terminated, row))
    }

    pub(super) async fn finished_impl(
        &self,
        session_id: &str,
    ) -> Result<Option<Finish>, SessionError> {
        let stored: Option<(Option<String>, Option<String>)> =
            sqlx::query_as("SELECT outcome, result FROM sessions WHERE session_id = $1")
                .bind(session_id)
                .fetch_optional(&self.pool)
                .await?;
        match stored {
            Some((outcome, result)) => Finish::stored(outcome, result),
            None => Ok(None),
        }
    }
}
