//! Messages to many and named groups on PostgreSQL. A fan-out is one
//! transaction: the sender's rate row first, then the candidates' session
//! rows, locked in id order (so two fan-outs over the same sessions queue
//! rather than deadlock), checked on what is locked; each recipient's
//! message, the request id, the audit entry, and the message events last.
//! A group's row is locked by whoever changes its members, so concurrent
//! additions count its size one after the other.

use sqlx::{PgConnection, Row};

use super::{
    PgStore, events,
    open::{RawSession, session_columns},
    sessions::{insert_body, insert_entry},
};
use crate::{
    error::{Reason, SessionError},
    model::{
        Audience, AuditRecord, FannedOut, GroupName, GroupRow, Idempotency, MessageRate,
        NewMessage, Reach, Reached, SessionRow, new_message_id, now_ms,
    },
    store::{
        Bounds, FanOut, FanOutCheck, MembersCheck,
        shared::{Unread, fan_out_record, fill_inboxes, replayed_fan_out},
    },
};

/// A group's row, without its members.
struct Found {
    group_id: String,
    created_by: String,
    created_at_ms: i64,
}

impl PgStore {
    pub(super) async fn fan_out_once(
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
                    written.push(events::message(
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
        Ok(FannedOut {
            reached,
            replayed: false,
        })
    }

    pub(super) async fn create_group_once(
        &self,
        workspace_id: &str,
        name: &GroupName,
        creator: &str,
        audit: &AuditRecord,
    ) -> Result<GroupRow, SessionError> {
        let mut tx = self.begin().await?;
        let group_id = format!("grp_{}", uuid::Uuid::now_v7().simple());
        let inserted = sqlx::query(
            "INSERT INTO groups (group_id, workspace_id, name, created_by, created_at_ms) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (workspace_id, name) DO NOTHING",
        )
        .bind(&group_id)
        .bind(workspace_id)
        .bind(name.as_str())
        .bind(creator)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        let found = find(&mut tx, workspace_id, name, false)
            .await?
            .ok_or_else(|| SessionError::Internal("a group just stored is missing".to_owned()))?;
        if inserted.rows_affected() == 1 {
            insert_member(&mut tx, &found.group_id, creator).await?;
            PgStore::insert_audit(&mut tx, audit).await?;
        } else if found.created_by != creator {
            return Err(SessionError::refused(
                Reason::GroupExists,
                format!("a group named {:?} exists in this workspace", name.as_str()),
            ));
        }
        let group = group_row(&mut tx, workspace_id, name, found).await?;
        tx.commit().await?;
        Ok(group)
    }

    pub(super) async fn add_group_members_once(
        &self,
        workspace_id: &str,
        name: &GroupName,
        adder: &str,
        members: &[String],
        audit: &AuditRecord,
        check: MembersCheck<'_>,
    ) -> Result<GroupRow, SessionError> {
        let mut tx = self.begin().await?;
        let found = member_of(&mut tx, workspace_id, name, adder, true).await?;
        let current = member_ids(&mut tx, &found.group_id).await?;
        let rows = sessions(&mut tx, members).await?;
        if let Some(missing) = members
            .iter()
            .find(|id| !rows.iter().any(|r| &r.session_id == *id))
        {
            return Err(SessionError::not_found(missing));
        }
        let mut new: Vec<&str> = Vec::new();
        for id in members {
            if !current.iter().any(|m| m == id) && !new.contains(&id.as_str()) {
                new.push(id);
            }
        }
        let mut after = current.clone();
        after.extend(new.iter().map(|id| (*id).to_owned()));
        let after = sessions(&mut tx, &after).await?;
        check(&rows, &after)?;
        for id in &new {
            insert_member(&mut tx, &found.group_id, id).await?;
        }
        PgStore::insert_audit(&mut tx, audit).await?;
        let group = group_row(&mut tx, workspace_id, name, found).await?;
        tx.commit().await?;
        Ok(group)
    }

    pub(super) async fn groups_impl(
        &self,
        workspace_id: &str,
        member: Option<&str>,
    ) -> Result<Vec<GroupRow>, SessionError> {
        let mut conn = self.pool.acquire().await?;
        let rows = sqlx::query(
            "SELECT g.group_id, g.name, g.created_by, g.created_at_ms FROM groups g \
             WHERE g.workspace_id = $1 AND ($2::text IS NULL OR EXISTS (SELECT 1 \
               FROM group_members m WHERE m.group_id = g.group_id AND m.session_id = $2)) \
             ORDER BY g.name",
        )
        .bind(workspace_id)
        .bind(member)
        .fetch_all(&mut *conn)
        .await?;
        let mut groups = Vec::with_capacity(rows.len());
        for row in rows {
            let name = GroupName::stored(row.try_get("name")?);
            let found = Found {
                group_id: row.try_get("group_id")?,
                created_by: row.try_get("created_by")?,
                created_at_ms: row.try_get("created_at_ms")?,
            };
            groups.push(group_row(&mut conn, workspace_id, &name, found).await?);
        }
        Ok(groups)
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
    in_order(raws, ids)
}

/// The rows of `ids` that exist, unlocked, in the order of `ids`.
async fn sessions(
    conn: &mut PgConnection,
    ids: &[String],
) -> Result<Vec<SessionRow>, SessionError> {
    let raws: Vec<RawSession> = sqlx::query_as(concat!(
        "SELECT ",
        session_columns!(),
        " FROM sessions WHERE session_id = ANY($1)"
    ))
    .bind(ids)
    .fetch_all(conn)
    .await?;
    in_order(raws, ids)
}

fn in_order(raws: Vec<RawSession>, ids: &[String]) -> Result<Vec<SessionRow>, SessionError> {
    let mut rows = raws
        .into_iter()
        .map(RawSession::into_row)
        .collect::<Result<Vec<_>, _>>()?;
    rows.sort_by_key(|r| ids.iter().position(|id| *id == r.session_id));
    Ok(rows)
}

async fn find(
    conn: &mut PgConnection,
    workspace_id: &str,
    name: &GroupName,
    lock: bool,
) -> Result<Option<Found>, SessionError> {
    let sql = if lock {
        "SELECT group_id, created_by, created_at_ms FROM groups \
         WHERE workspace_id = $1 AND name = $2 FOR UPDATE"
    } else {
        "SELECT group_id, created_by, created_at_ms FROM groups \
         WHERE workspace_id = $1 AND name = $2"
    };
    let row = sqlx::query(sql)
        .bind(workspace_id)
        .bind(name.as_str())
        .fetch_optional(conn)
        .await?;
    row.map(|row| {
        Ok(Found {
            group_id: row.try_get("group_id")?,
            created_by: row.try_get("created_by")?,
            created_at_ms: row.try_get("created_at_ms")?,
        })
    })
    .transpose()
}

/// The group (locked, with `lock`), if `session_id` is one of its members;
/// else it is answered as one that does not exist.
async fn member_of(
    conn: &mut PgConnection,
    workspace_id: &str,
    name: &GroupName,
    session_id: &str,
    lock: bool,
) -> Result<Found, SessionError> {
    let not_member = || {
        SessionError::refused(
            Reason::GroupNotFound,
            format!(
                "group not found: {:?} (or this session is not a member)",
                name.as_str()
            ),
        )
    };
    let found = find(conn, workspace_id, name, lock)
        .await?
        .ok_or_else(not_member)?;
    let ids = member_ids(conn, &found.group_id).await?;
    if !ids.iter().any(|id| id == session_id) {
        return Err(not_member());
    }
    Ok(found)
}

/// A group's members, oldest first.
async fn member_ids(conn: &mut PgConnection, group_id: &str) -> Result<Vec<String>, SessionError> {
    Ok(sqlx::query_scalar(
        "SELECT session_id FROM group_members WHERE group_id = $1 \
         ORDER BY added_at_ms, session_id",
    )
    .bind(group_id)
    .fetch_all(conn)
    .await?)
}

async fn insert_member(
    conn: &mut PgConnection,
    group_id: &str,
    session_id: &str,
) -> Result<(), SessionError> {
    sqlx::query(
        "INSERT INTO group_members (group_id, session_id, added_at_ms) VALUES ($1, $2, $3) \
         ON CONFLICT DO NOTHING",
    )
    .bind(group_id)
    .bind(session_id)
    .bind(now_ms())
    .execute(conn)
    .await?;
    Ok(())
}

/// A group with its members' rows.
async fn group_row(
    conn: &mut PgConnection,
    workspace_id: &str,
    name: &GroupName,
    found: Found,
) -> Result<GroupRow, SessionError> {
    let ids = member_ids(conn, &found.group_id).await?;
    let members = sessions(conn, &ids).await?;
    Ok(GroupRow {
        group_id: found.group_id,
        workspace_id: workspace_id.to_owned(),
        name: name.clone(),
        created_by: found.created_by,
        created_at_ms: found.created_at_ms,
        members,
    })
}
