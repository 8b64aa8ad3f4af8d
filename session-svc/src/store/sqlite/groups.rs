//! Messages to many and named groups on SQLite: a fan-out is one batch
//! (every recipient's message, the sender's rate state, the request id and
//! the audit entry), its candidates read from the ledger (sessions) and the
//! writer's connection (groups) under the writer lock, so nothing changes
//! between the check and the commit.

use sqlx::{Row, SqliteConnection};

use super::{SqliteStore, write::Write, writer::Begun};
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

impl SqliteStore {
    pub(super) async fn fan_out_impl(
        &self,
        out: &FanOut,
        idem: Option<Idempotency>,
        mut audit: AuditRecord,
        bounds: Bounds<'_>,
        check: FanOutCheck<'_>,
    ) -> Result<FannedOut, SessionError> {
        let mut w = self.writer().await?;
        let mut batch = match self.begin(&mut w, idem.as_ref()).await? {
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
                    batch.entry(&session_id, &message, body_id);
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
        audit.detail = record.to_string();
        batch.remember(idem.as_ref(), record).audit(&audit);
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
                let group = member_of(conn, workspace_id, name, poster).await?;
                let mut ids = member_ids(conn, &group.group_id).await?;
                ids.retain(|id| id != poster);
                ledger_rows(ids)
            }
        })
    }

    pub(super) async fn create_group_impl(
        &self,
        workspace_id: &str,
        name: &GroupName,
        creator: &str,
        audit: AuditRecord,
    ) -> Result<GroupRow, SessionError> {
        let mut w = self.writer().await?;
        if let Some(found) = find(&mut w.conn, workspace_id, name).await? {
            if found.created_by != creator {
                return Err(taken(name));
            }
            return self.group_row(&mut w.conn, workspace_id, name, found).await;
        }
        let found = Found {
            group_id: format!("grp_{}", uuid::Uuid::now_v7().simple()),
            created_by: creator.to_owned(),
            created_at_ms: now_ms(),
        };
        let mut tx = Write::begin(&mut w.conn).await?;
        sqlx::query(
            "INSERT INTO groups (group_id, workspace_id, name, created_by, created_at_ms) \
             VALUES (?, ?, ?, ?, ?)",
        )
        .bind(&found.group_id)
        .bind(workspace_id)
        .bind(name.as_str())
        .bind(creator)
        .bind(found.created_at_ms)
        .execute(tx.conn())
        .await?;
        insert_member(tx.conn(), &found.group_id, creator).await?;
        tx.audit(&audit).await?;
        tx.commit().await?;
        self.group_row(&mut w.conn, workspace_id, name, found).await
    }

    pub(super) async fn add_group_members_impl(
        &self,
        workspace_id: &str,
        name: &GroupName,
        adder: &str,
        members: &[String],
        audit: AuditRecord,
        check: MembersCheck<'_>,
    ) -> Result<GroupRow, SessionError> {
        let mut w = self.writer().await?;
        let found = member_of(&mut w.conn, workspace_id, name, adder).await?;
        let mut current = member_ids(&mut w.conn, &found.group_id).await?;
        let mut rows = Vec::with_capacity(members.len());
        for id in members {
            let row = self
                .ledger()
                .get(id)
                .ok_or_else(|| SessionError::not_found(id))?;
            rows.push(row);
        }
        let mut new: Vec<&str> = Vec::new();
        for id in members {
            if !current.iter().any(|m| m == id) && !new.contains(&id.as_str()) {
                new.push(id);
            }
        }
        let after: Vec<SessionRow> = current
            .iter()
            .map(String::as_str)
            .chain(new.iter().copied())
            .filter_map(|id| self.ledger().get(id))
            .collect();
        check(&rows, &after)?;
        let mut tx = Write::begin(&mut w.conn).await?;
        for id in &new {
            insert_member(tx.conn(), &found.group_id, id).await?;
        }
        tx.audit(&audit).await?;
        tx.commit().await?;
        current.extend(new.iter().map(|id| (*id).to_owned()));
        self.group_row(&mut w.conn, workspace_id, name, found).await
    }

    pub(super) async fn groups_impl(
        &self,
        workspace_id: &str,
        member: Option<&str>,
    ) -> Result<Vec<GroupRow>, SessionError> {
        let mut conn = self.pool.acquire().await?;
        let rows = sqlx::query(
            "SELECT g.group_id, g.name, g.created_by, g.created_at_ms FROM groups g \
             WHERE g.workspace_id = ?1 AND (?2 IS NULL OR EXISTS (SELECT 1 FROM group_members m \
               WHERE m.group_id = g.group_id AND m.session_id = ?2)) \
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
            groups.push(
                self.group_row(&mut conn, workspace_id, &name, found)
                    .await?,
            );
        }
        Ok(groups)
    }

    /// A group with its members' rows, from the ledger.
    async fn group_row(
        &self,
        conn: &mut SqliteConnection,
        workspace_id: &str,
        name: &GroupName,
        found: Found,
    ) -> Result<GroupRow, SessionError> {
        let ids = member_ids(conn, &found.group_id).await?;
        let ledger = self.ledger();
        Ok(GroupRow {
            group_id: found.group_id,
            workspace_id: workspace_id.to_owned(),
            name: name.clone(),
            created_by: found.created_by,
            created_at_ms: found.created_at_ms,
            members: ids.iter().filter_map(|id| ledger.get(id)).collect(),
        })
    }
}

/// A group's name taken by another session's group.
fn taken(name: &GroupName) -> SessionError {
    SessionError::refused(
        Reason::GroupExists,
        format!("a group named {:?} exists in this workspace", name.as_str()),
    )
}

/// A group the caller is not a member of, answered as one that does not exist.
fn not_member(name: &GroupName) -> SessionError {
    SessionError::refused(
        Reason::GroupNotFound,
        format!(
            "group not found: {:?} (or this session is not a member)",
            name.as_str()
        ),
    )
}

async fn find(
    conn: &mut SqliteConnection,
    workspace_id: &str,
    name: &GroupName,
) -> Result<Option<Found>, SessionError> {
    let row = sqlx::query(
        "SELECT group_id, created_by, created_at_ms FROM groups \
         WHERE workspace_id = ? AND name = ?",
    )
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

/// The group, if `session_id` is one of its members.
async fn member_of(
    conn: &mut SqliteConnection,
    workspace_id: &str,
    name: &GroupName,
    session_id: &str,
) -> Result<Found, SessionError> {
    let found = find(conn, workspace_id, name)
        .await?
        .ok_or_else(|| not_member(name))?;
    let ids = member_ids(conn, &found.group_id).await?;
    if !ids.iter().any(|id| id == session_id) {
        return Err(not_member(name));
    }
    Ok(found)
}

/// A group's members, oldest first.
async fn member_ids(
    conn: &mut SqliteConnection,
    group_id: &str,
) -> Result<Vec<String>, SessionError> {
    Ok(sqlx::query_scalar(
        "SELECT session_id FROM group_members WHERE group_id = ? ORDER BY added_at_ms, rowid",
    )
    .bind(group_id)
    .fetch_all(conn)
    .await?)
}

async fn insert_member(
    conn: &mut SqliteConnection,
    group_id: &str,
    session_id: &str,
) -> Result<(), SessionError> {
    sqlx::query(
        "INSERT INTO group_members (group_id, session_id, added_at_ms) VALUES (?, ?, ?) \
         ON CONFLICT DO NOTHING",
    )
    .bind(group_id)
    .bind(session_id)
    .bind(now_ms())
    .execute(conn)
    .await?;
    Ok(())
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
