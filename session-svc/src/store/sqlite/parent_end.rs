//! A session's end reaching its children, on SQLite: who is reached and how
//! is `policy::parent_end`'s to decide; this applies it inside the
//! transaction that ends the session, whatever ended it.

use troupe_proto::session::SessionStatus;

use super::{
    SqliteStore,
    write::{INSERT_BODY, INSERT_ENTRY, Write, entry_from_row, session_columns},
};
use crate::{
    error::SessionError,
    model::{EventKind, ParentEnd, Principal, SessionRow, now_ms},
    policy::{self, Member},
    store::{
        journal::message_detail,
        parent_end::{Applied, cascade_detail, notice, orphaned_detail},
    },
};

impl SqliteStore {
    /// The active sessions below `session_id`, in creation order, as the
    /// rule reads them: the ledger is exact under the writer lock.
    pub(super) fn members_below(&self, session_id: &str) -> Vec<Member> {
        let ledger = self.ledger();
        ledger
            .active_subtree(session_id)
            .iter()
            .filter(|id| *id != session_id)
            .filter_map(|id| ledger.get(id))
            .map(|row| Member::of(&row))
            .collect()
    }
}

/// Applies `ended`'s end (its row as it ended) to `members`, the active
/// sessions below it (`SqliteStore::members_below`, read before the end):
/// children terminated (by `by`), orphaned, sent their notice, with their
/// events and one audit entry. Returns the rows it changed, for the ledger
/// after the commit, and what it did.
pub(super) async fn apply(
    tx: &mut Write<'_>,
    ended: &SessionRow,
    members: &[Member],
    by: &Principal,
) -> Result<(Vec<(i64, SessionRow)>, Applied), SessionError> {
    let mut rows = Vec::new();
    let mut applied = Applied::default();
    for reached in policy::parent_end(&ended.session_id, ended.status, members) {
        let id = reached.session_id.as_str();
        if reached.policy == ParentEnd::Terminate {
            let Some(entry) = tx
                .end_session(id, SessionStatus::Terminated, "cascade")
                .await?
            else {
                continue;
            };
            tx.event(
                id,
                EventKind::Terminated,
                SessionStatus::Terminated,
                cascade_detail(by, reached.parent_status),
            )
            .await?;
            rows.push(entry);
            applied.record(&reached);
            continue;
        }
        let orphan = sqlx::query(concat!(
            "UPDATE sessions SET orphaned = 1 \
             WHERE session_id = ?1 AND status IN ('pending', 'running') RETURNING ",
            session_columns!()
        ))
        .bind(id)
        .fetch_optional(tx.conn())
        .await?;
        let Some((rowid, mut row)) = orphan.as_ref().map(entry_from_row).transpose()? else {
            continue;
        };
        tx.event(
            id,
            EventKind::Orphaned,
            row.status,
            orphaned_detail(reached.policy, reached.parent_status),
        )
        .await?;
        if reached.policy == ParentEnd::Notify {
            // As every message: its event, and the inbox's sequence by trigger.
            let message = notice(&reached, ended);
            sqlx::query(INSERT_BODY)
                .bind(&message.message_id)
                .bind(&message.body)
                .execute(tx.conn())
                .await?;
            let seq: i64 = sqlx::query_scalar(INSERT_ENTRY)
                .bind(&message.message_id)
                .bind(message.sender.to_string())
                .bind(&message.message_id)
                .bind(message.body.len() as i64)
                .bind(now_ms())
                .bind(id)
                .fetch_one(tx.conn())
                .await?;
            tx.event(
                id,
                EventKind::Message,
                row.status,
                message_detail(&message.message_id, seq, message.body.len()),
            )
            .await?;
            row.inbox_seq = seq;
        }
        rows.push((rowid, row));
        applied.record(&reached);
    }
    if !applied.is_empty() {
        tx.audit(&applied.audit(&ended.session_id)).await?;
    }
    Ok((rows, applied))
}
