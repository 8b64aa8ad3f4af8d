//! Named groups, written once for both backends (see `backends`): a
//! group's row, its members, creating one and adding to it. Whoever changes
//! a group's members first locks its row (PostgreSQL; SQLite's writer lock
//! serialises every write), so concurrent additions count its size one
//! after the other. Members' session rows come from `This::rows_of` (the
//! ledger on SQLite, a query on PostgreSQL).
//!
//! A fan-out to a group (each backend's `groups`) finds its members here.

use std::future::Future;

use super::{MembersCheck, backends::each_backend};
use crate::{
    error::{Reason, SessionError},
    model::{AuditRecord, GroupName, GroupRow, SessionId, WorkspaceId},
};

/// The groups; every [`super::Store`] is one.
pub trait GroupStore: Send + Sync {
    /// Creates the group `name` of `workspace_id` with `creator` as its
    /// first member, with `audit`; the creator's own group of that name is
    /// returned as it is (nothing written), another's is GROUP_EXISTS.
    fn create_group(
        &self,
        workspace_id: &WorkspaceId,
        name: &GroupName,
        creator: &SessionId,
        audit: AuditRecord,
    ) -> impl Future<Output = Result<GroupRow, SessionError>> + Send;

    /// Adds `members` to the group `name` of `workspace_id` if `adder` is a
    /// member (else GROUP_NOT_FOUND) and `check` allows them all, in one
    /// transaction (members already in stay, once), with `audit`. Returns
    /// the group after.
    fn add_group_members(
        &self,
        workspace_id: &WorkspaceId,
        name: &GroupName,
        adder: &SessionId,
        members: &[SessionId],
        audit: AuditRecord,
        check: MembersCheck<'_>,
    ) -> impl Future<Output = Result<GroupRow, SessionError>> + Send;

    /// Returns the groups of `workspace_id`, by name: every one, or only
    /// those `member` is a member of.
    fn groups(
        &self,
        workspace_id: &WorkspaceId,
        member: Option<&SessionId>,
    ) -> impl Future<Output = Result<Vec<GroupRow>, SessionError>> + Send;
}

/// A group's row, without its members.
pub(super) struct Found {
    pub(super) group_id: String,
    created_by: String,
    created_at_ms: i64,
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

each_backend! {
    use sqlx::Row;

    use super::{Found, GroupStore, not_member};
    use crate::{
        error::{Reason, SessionError},
        model::{WorkspaceId, AuditRecord, GroupName, GroupRow, SessionId, now_ms},
        MembersCheck,
    };

    impl This {

        async fn add_group_members_once(
            &self,
            workspace_id: &str,
            name: &GroupName,
            adder: &str,
            members: &[SessionId],
            audit: &AuditRecord,
            check: MembersCheck<'_>,
        ) -> Result<GroupRow, SessionError> {
            let mut tx = self.tx().await?;
            let found = member_of(tx.conn(), workspace_id, name, adder, true).await?;
            let current = member_ids(tx.conn(), &found.group_id).await?;
            let rows = self.rows_of(tx.conn(), members).await?;
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
            after.extend(new.iter().map(|id| SessionId::from(*id)));
            let after = self.rows_of(tx.conn(), &after).await?;
            check(&rows, &after)?;
            for id in &new {
                insert_member(tx.conn(), &found.group_id, id).await?;
            }
            This::insert_audit(tx.conn(), audit).await?;
            let group = self.group_row(tx.conn(), workspace_id, name, found).await?;
            tx.commit().await?;
            Ok(group)
        }

        /// A group with its members' rows.
        async fn group_row(
            &self,
            conn: &mut Conn,
            workspace_id: &str,
            name: &GroupName,
            found: Found,
        ) -> Result<GroupRow, SessionError> {
            let ids = member_ids(conn, &found.group_id).await?;
            let members = self.rows_of(conn, &ids).await?;
            Ok(GroupRow {
                group_id: found.group_id,
                workspace_id: workspace_id.into(),
                name: name.clone(),
                created_by: found.created_by,
                created_at_ms: found.created_at_ms,
                members,
            })
        }
    }

    impl GroupStore for This {
        async fn create_group(
            &self,
            workspace_id: &WorkspaceId,
            name: &GroupName,
            creator: &SessionId,
            audit: AuditRecord,
        ) -> Result<GroupRow, SessionError> {
            let audit = &audit;
            retrying!(async {
                let mut tx = self.tx().await?;
                let inserted = sqlx::query(
                    "INSERT INTO groups (group_id, workspace_id, name, created_by, created_at_ms) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (workspace_id, name) DO NOTHING",
                )
                .bind(format!("grp_{}", uuid::Uuid::now_v7().simple()))
                .bind(workspace_id)
                .bind(name.as_str())
                .bind(creator)
                .bind(now_ms())
                .execute(tx.conn())
                .await?;
                let found = find(tx.conn(), workspace_id, name, false)
                    .await?
                    .ok_or_else(|| SessionError::Internal("a group just stored is missing".to_owned()))?;
                if inserted.rows_affected() == 1 {
                    insert_member(tx.conn(), &found.group_id, creator).await?;
                    This::insert_audit(tx.conn(), audit).await?;
                } else if found.created_by != creator.as_str() {
                    return Err(SessionError::refused(
                        Reason::GroupExists,
                        format!("a group named {:?} exists in this workspace", name.as_str()),
                    ));
                }
                let group = self.group_row(tx.conn(), workspace_id, name, found).await?;
                tx.commit().await?;
                Ok(group)
            })
        }

        async fn add_group_members(
            &self,
            workspace_id: &WorkspaceId,
            name: &GroupName,
            adder: &SessionId,
            members: &[SessionId],
            audit: AuditRecord,
            check: MembersCheck<'_>,
        ) -> Result<GroupRow, SessionError> {
            retrying!(self.add_group_members_once(
                workspace_id,
                name,
                adder,
                members,
                &audit,
                check
            ))
        }

        async fn groups(
            &self,
            workspace_id: &WorkspaceId,
            member: Option<&SessionId>,
        ) -> Result<Vec<GroupRow>, SessionError> {
            let mut conn = self.pool.acquire().await?;
            let rows = sqlx::query(
                "SELECT g.group_id, g.name, g.created_by, g.created_at_ms FROM groups g \
                 WHERE g.workspace_id = $1 AND (CAST($2 AS TEXT) IS NULL OR EXISTS (SELECT 1 \
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
                let found = found(&row)?;
                groups.push(self.group_row(&mut conn, workspace_id, &name, found).await?);
            }
            Ok(groups)
        }
    }

    fn found(row: &<Db as sqlx::Database>::Row) -> Result<Found, SessionError> {
        Ok(Found {
            group_id: row.try_get("group_id")?,
            created_by: row.try_get("created_by")?,
            created_at_ms: row.try_get("created_at_ms")?,
        })
    }

    /// The group `name` of `workspace_id`, its row locked with `lock`.
    async fn find(
        conn: &mut Conn,
        workspace_id: &str,
        name: &GroupName,
        lock: bool,
    ) -> Result<Option<Found>, SessionError> {
        let sql = if lock {
            concat!(
                "SELECT group_id, created_by, created_at_ms FROM groups \
                 WHERE workspace_id = $1 AND name = $2",
                for_update!()
            )
        } else {
            "SELECT group_id, created_by, created_at_ms FROM groups \
             WHERE workspace_id = $1 AND name = $2"
        };
        let row = sqlx::query(sql)
            .bind(workspace_id)
            .bind(name.as_str())
            .fetch_optional(conn)
            .await?;
        row.as_ref().map(found).transpose()
    }

    impl This {
        /// The group `name`'s members but `poster`, who must be one of
        /// them (else it is answered as a group that does not exist),
        /// oldest first: a post's audience.
        pub(crate) async fn audience_of_post(
            conn: &mut Conn,
            workspace_id: &str,
            name: &GroupName,
            poster: &str,
        ) -> Result<Vec<SessionId>, SessionError> {
            let group = member_of(conn, workspace_id, name, poster, false).await?;
            let mut ids = member_ids(conn, &group.group_id).await?;
            ids.retain(|id| id != poster);
            Ok(ids)
        }
    }

    /// The group (locked, with `lock`), if `session_id` is one of its
    /// members; else it is answered as one that does not exist.
    async fn member_of(
        conn: &mut Conn,
        workspace_id: &str,
        name: &GroupName,
        session_id: &str,
        lock: bool,
    ) -> Result<Found, SessionError> {
        let found = find(conn, workspace_id, name, lock)
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
        conn: &mut Conn,
        group_id: &str,
    ) -> Result<Vec<SessionId>, SessionError> {
        Ok(sqlx::query_scalar(
            "SELECT session_id FROM group_members WHERE group_id = $1 \
             ORDER BY added_at_ms, session_id",
        )
        .bind(group_id)
        .fetch_all(conn)
        .await?)
    }

    async fn insert_member(
        conn: &mut Conn,
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
}
