//! A session's end reaching its children, on PostgreSQL: who is reached and
//! how is `policy::parent_end`'s to decide; this applies it inside the
//! transaction that ends the session, whatever ended it. The caller holds
//! the workspace and tree locks (`locks::place_of`), so no spawn under the
//! subtree and no other end in it commits meanwhile; the rows it changes
//! are locked by its updates, after those (the lock order of `locks`).

use sqlx::PgConnection;
use troupe_proto::session::SessionStatus;

use super::{
    events::NewEvent,
    locks,
    open::{RawSession, session_columns},
    sessions::insert_message,
};
use crate::{
    error::SessionError,
    model::{EventKind, ParentEnd, Principal, SessionRow},
    policy::{self, Member},
    store::{
        parent_end::{Applied, cascade_detail, notice, orphaned_detail},
        parse_stored,
    },
};

/// The active sessions below `session_id`, level by level, each level in
/// creation order.
async fn members_below(
    conn: &mut PgConnection,
    session_id: &str,
) -> Result<Vec<Member>, SessionError> {
    let rows: Vec<(String, Option<String>, String)> = sqlx::query_as(
        "WITH RECURSIVE down(session_id, parent, row_id, status, policy, level) AS ( \
           SELECT session_id, parent_session_id, row_id, status, on_parent_end, 0 \
           FROM sessions WHERE session_id = $1 \
           UNION ALL \
           SELECT s.session_id, s.parent_session_id, s.row_id, s.status, s.on_parent_end, \
             down.level + 1 \
           FROM sessions s JOIN down ON s.parent_session_id = down.session_id) \
         SELECT session_id, parent, policy FROM down \
         WHERE level > 0 AND status IN ('pending', 'running') ORDER BY level, row_id",
    )
    .bind(session_id)
    .fetch_all(conn)
    .await?;
    rows.into_iter()
        .map(|(session_id, parent_session_id, policy)| {
            Ok(Member {
                session_id,
                parent_session_id,
                on_parent_end: parse_stored("parent-end policy", &policy, ParentEnd::parse)?,
            })
        })
        .collect()
}

/// What applying a session's end to its children wrote.
pub(super) struct Reached {
    /// The rows it changed (terminated, orphaned).
    pub rows: Vec<SessionRow>,
    /// Their events, to write after the ended session's own.
    pub events: Vec<NewEvent>,
    pub applied: Applied,
}

/// Applies `ended`'s end (its row as it ended) to the active sessions below
/// it: children terminated (by `by`), orphaned, sent their notice, with one
/// audit entry; the events are the caller's to write, last (`events`).
pub(super) async fn apply(
    conn: &mut PgConnection,
    ended: &SessionRow,
    by: &Principal,
) -> Result<Reached, SessionError> {
    let members = members_below(&mut *conn, &ended.session_id).await?;
    let plan = policy::parent_end(&ended.session_id, ended.status, &members);
    let (terminate, orphan): (Vec<_>, Vec<_>) =
        plan.iter().partition(|r| r.policy == ParentEnd::Terminate);
    let ids = |reached: &[&policy::ParentEnded]| -> Vec<String> {
        reached.iter().map(|r| r.session_id.clone()).collect()
    };
    let mut terminated = locks::end_sessions(
        &mut *conn,
        &ids(&terminate),
        SessionStatus::Terminated,
        "",
        "cascade",
        "cascade",
    )
    .await?;
    let orphaned: Vec<RawSession> = sqlx::query_as(concat!(
        "UPDATE sessions SET orphaned = TRUE \
         WHERE session_id = ANY($1) AND status IN ('pending', 'running') RETURNING ",
        session_columns!()
    ))
    .bind(ids(&orphan))
    .fetch_all(&mut *conn)
    .await?;
    let mut orphaned = super::open::rows(orphaned)?;
    let mut reached = Reached {
        rows: Vec::new(),
        events: Vec::new(),
        applied: Applied::default(),
    };
    for r in &plan {
        if r.policy == ParentEnd::Terminate {
            let Some(at) = terminated.iter().position(|t| t.session_id == r.session_id) else {
                continue;
            };
            reached.events.push(NewEvent::new(
                &r.session_id,
                EventKind::Terminated,
                SessionStatus::Terminated,
                cascade_detail(by, r.parent_status),
            ));
            reached.rows.push(terminated.swap_remove(at));
        } else {
            let Some(at) = orphaned.iter().position(|o| o.session_id == r.session_id) else {
                continue;
            };
            let mut row = orphaned.swap_remove(at);
            reached.events.push(NewEvent::new(
                &r.session_id,
                EventKind::Orphaned,
                row.status,
                orphaned_detail(r.policy, r.parent_status),
            ));
            if r.policy == ParentEnd::Notify {
                let message = notice(r, ended);
                row.inbox_seq = insert_message(&mut *conn, &r.session_id, &message).await?;
                reached.events.push(NewEvent::message(
                    &r.session_id,
                    row.status,
                    &message.message_id,
                    row.inbox_seq,
                    &message.body,
                ));
            }
            reached.rows.push(row);
        }
        reached.applied.record(r);
    }
    if !reached.applied.is_empty() {
        super::PgStore::insert_audit(&mut *conn, &reached.applied.audit(&ended.session_id)).await?;
    }
    Ok(reached)
}
