//! Budgets and usage on PostgreSQL: reservations, settlements, stale
//! reservations released, accounts read, and the sessions whose wall-clock
//! budget ran out.
//!
//! A reservation locks the accounts of its session's path root-down (by
//! depth) before it reads them, so reservations in one tree queue on their
//! common ancestors and none can pass a check another's commit would fail;
//! locking along paths of a tree in depth order cannot deadlock. Account
//! rows are taken before any session row (a settlement's event) and by no
//! transaction that holds one (see `locks`).

use serde_json::json;
use sqlx::PgConnection;
use troupe_proto::session::SessionStatus;

use super::{
    PgStore,
    events::{self, NewEvent},
    lease, locks,
};
use crate::{
    error::SessionError,
    model::{AuditRecord, EventKind, ExitReason, Principal},
    store::Fence,
};

/// Inserts a new session's account.
pub(super) async fn insert_account(
    conn: &mut PgConnection,
    session_id: &str,
    depth: u32,
    limits: [Option<i64>; 4],
    deadline_ms: Option<i64>,
) -> Result<(), SessionError> {
    let [cost, tokens, calls, wall] = limits;
    sqlx::query(
        "INSERT INTO accounts (session_id, depth, cost_limit, tokens_limit, calls_limit, \
         wall_ms, deadline_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(session_id)
    .bind(i64::from(depth))
    .bind(cost)
    .bind(tokens)
    .bind(calls)
    .bind(wall)
    .bind(deadline_ms)
    .execute(conn)
    .await?;
    Ok(())
}

impl PgStore {
    pub(super) async fn end_for_budget_once(
        &self,
        fence: &Fence,
        session_id: &str,
        audit: &AuditRecord,
    ) -> Result<Vec<String>, SessionError> {
        let mut tx = self.begin().await?;
        lease::check(&mut tx, fence).await?;
        locks::place_of(&mut tx, session_id).await?;
        let (row, _) = locks::session(&mut tx, session_id).await?;
        if !row.is_active() {
            return Ok(Vec::new());
        }
        let subtree = locks::active_subtree(&mut tx, session_id).await?;
        let reason = ExitReason::Budget.as_str();
        let mut ended = locks::end_sessions(
            &mut tx,
            &subtree,
            SessionStatus::Terminated,
            session_id,
            reason,
            reason,
        )
        .await?;
        ended.sort_by_key(|r| subtree.iter().position(|id| *id == r.session_id));
        let ids: Vec<String> = ended.iter().map(|r| r.session_id.clone()).collect();
        let mut audit = audit.clone();
        audit.detail = json!({"terminated": ids}).to_string();
        PgStore::insert_audit(&mut tx, &audit).await?;
        let terminated: Vec<NewEvent> = ids
            .iter()
            .map(|id| {
                NewEvent::new(
                    id,
                    EventKind::Terminated,
                    SessionStatus::Terminated,
                    json!({"reason": reason, "terminated_by": Principal::Troupe.to_string()}),
                )
            })
            .collect();
        events::write(&mut tx, &terminated, !ids.is_empty()).await?;
        tx.commit().await?;
        self.published(!ids.is_empty());
        Ok(ids)
    }
}
