//! What the services on one database share, written once for both backends
//! (see `backends`): settings, the operator token, the token signing keys
//! and the agent definitions. Each write is one statement, or one
//! transaction with its audit entry; the statements are atomic across
//! replicas by themselves (`ON CONFLICT`), so the first of several replicas
//! starting together wins and every one reads its value back.

use std::future::Future;

use super::backends::each_backend;
use crate::{
    error::SessionError,
    model::{AgentScope, AuditRecord, NewAgent, OperatorToken, StoredAgent, WorkspaceId},
};

/// Stores a shared setting unless one of that name is stored or, with the
/// fourth parameter, in its place; returns the stored value.
const CLAIM_SETTING: &str = "INSERT INTO settings (name, value, updated_at_ms) VALUES ($1, $2, $3) \
     ON CONFLICT (name) DO UPDATE SET \
       value = CASE WHEN $4 THEN excluded.value ELSE settings.value END, \
       updated_at_ms = CASE WHEN $4 THEN excluded.updated_at_ms ELSE settings.updated_at_ms END \
     RETURNING value";

/// The shared settings, tokens, keys and agent definitions; every
/// [`super::Store`] is one.
pub trait CatalogStore: Send + Sync {
    /// Returns the shared setting `name` after storing `offered` as its
    /// value if it has none or, with `replace`, in place of the one it has.
    fn claim_setting(
        &self,
        name: &str,
        offered: &str,
        replace: bool,
    ) -> impl Future<Output = Result<String, SessionError>> + Send;

    /// The shared setting `name`, if one is stored.
    fn setting(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<String>, SessionError>> + Send;

    /// Stores `candidate` as the operator token unless one is stored
    /// already, in one statement that never replaces it, then returns the
    /// stored one: the first service to start on a database sets it.
    fn claim_operator_token(
        &self,
        candidate: &OperatorToken,
    ) -> impl Future<Output = Result<OperatorToken, SessionError>> + Send;

    /// Returns every token signing key, `(kid, secret)`, newest first.
    fn signing_keys(
        &self,
    ) -> impl Future<Output = Result<Vec<(String, Vec<u8>)>, SessionError>> + Send;

    /// Stores a new token signing key.
    fn add_signing_key(
        &self,
        kid: &str,
        secret: &[u8],
    ) -> impl Future<Output = Result<(), SessionError>> + Send;

    /// Stores an agent definition, replacing the one of the same scope and
    /// name, with its audit entry, in one transaction; returns it as stored.
    fn apply_agent(
        &self,
        agent: NewAgent,
        audit: AuditRecord,
    ) -> impl Future<Output = Result<StoredAgent, SessionError>> + Send;

    /// Returns the stored agent definitions of `scope`, or all of them
    /// (`None`): those for every workspace first, then by workspace and name
    /// (compared byte by byte).
    fn list_agents(
        &self,
        scope: Option<&AgentScope>,
    ) -> impl Future<Output = Result<Vec<StoredAgent>, SessionError>> + Send;

    /// Removes the agent definition of `scope` named `name`, with its audit
    /// entry, in one transaction; returns what was removed, or `None` (and
    /// writes nothing) if there was none.
    fn remove_agent(
        &self,
        scope: &AgentScope,
        name: &str,
        audit: AuditRecord,
    ) -> impl Future<Output = Result<Option<StoredAgent>, SessionError>> + Send;

    /// Returns the stored definition a session of `workspace_id` named
    /// `name` runs: the workspace's own, else the one for every workspace.
    fn find_agent(
        &self,
        workspace_id: &WorkspaceId,
        name: &str,
    ) -> impl Future<Output = Result<Option<StoredAgent>, SessionError>> + Send;
}

each_backend! {
    use super::{CLAIM_SETTING, CatalogStore};
    use crate::{
        error::SessionError,
        model::{WorkspaceId, AgentScope, AuditRecord, NewAgent, OperatorToken, StoredAgent, now_ms},
        agent_rows::{AgentRow, agent_columns, command_json, env_json},
    };

    impl CatalogStore for This {
        async fn claim_setting(
            &self,
            name: &str,
            offered: &str,
            replace: bool,
        ) -> Result<String, SessionError> {
            Ok(sqlx::query_scalar(CLAIM_SETTING)
                .bind(name)
                .bind(offered)
                .bind(now_ms())
                .bind(replace)
                .fetch_one(&mut *self.write_conn().await?)
                .await?)
        }

        async fn setting(&self, name: &str) -> Result<Option<String>, SessionError> {
            Ok(sqlx::query_scalar("SELECT value FROM settings WHERE name = $1")
                .bind(name)
                .fetch_optional(&self.pool)
                .await?)
        }

        async fn claim_operator_token(
            &self,
            candidate: &OperatorToken,
        ) -> Result<OperatorToken, SessionError> {
            let mut conn = self.write_conn().await?;
            sqlx::query(
                "INSERT INTO operator_token (id, token, created_at_ms) VALUES (1, $1, $2) \
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(candidate.expose())
            .bind(now_ms())
            .execute(&mut *conn)
            .await?;
            let stored: String =
                sqlx::query_scalar("SELECT token FROM operator_token WHERE id = 1")
                    .fetch_one(&mut *conn)
                    .await?;
            OperatorToken::new(&stored).ok_or_else(|| {
                SessionError::Internal("the stored operator token is too short".into())
            })
        }

        async fn signing_keys(&self) -> Result<Vec<(String, Vec<u8>)>, SessionError> {
            Ok(sqlx::query_as(
                "SELECT kid, secret FROM signing_keys ORDER BY created_at_ms DESC, kid",
            )
            .fetch_all(&self.pool)
            .await?)
        }

        async fn add_signing_key(&self, kid: &str, secret: &[u8]) -> Result<(), SessionError> {
            sqlx::query(
                "INSERT INTO signing_keys (kid, secret, created_at_ms) VALUES ($1, $2, $3)",
            )
            .bind(kid)
            .bind(secret)
            .bind(now_ms())
            .execute(&mut *self.write_conn().await?)
            .await?;
            Ok(())
        }

        async fn apply_agent(
            &self,
            agent: NewAgent,
            audit: AuditRecord,
        ) -> Result<StoredAgent, SessionError> {
            let (agent, audit) = (&agent, &audit);
            retrying!(async {
                let env = env_json(agent)?;
                let command = command_json(agent)?;
                let mut tx = self.tx().await?;
                let row: AgentRow = sqlx::query_as(concat!(
                    "INSERT INTO agents (",
                    agent_columns!(),
                    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
                     ON CONFLICT (workspace_id, name) DO UPDATE SET \
                       description = excluded.description, command = excluded.command, \
                       prompt = excluded.prompt, definition = excluded.definition, \
                       updated_at_ms = excluded.updated_at_ms, updated_by = excluded.updated_by, \
                       env = excluded.env \
                     RETURNING ",
                    agent_columns!()
                ))
                .bind(agent.scope.workspace_id())
                .bind(&agent.definition.name)
                .bind(&agent.definition.description)
                .bind(&command)
                .bind(&agent.definition.prompt)
                .bind(&agent.source)
                .bind(now_ms())
                .bind(agent.applied_by.to_string())
                .bind(&env)
                .fetch_one(tx.conn())
                .await?;
                This::insert_audit(tx.conn(), audit).await?;
                tx.commit().await?;
                row.into_stored()
            })
        }

        async fn list_agents(
            &self,
            scope: Option<&AgentScope>,
        ) -> Result<Vec<StoredAgent>, SessionError> {
            let mut rows: Vec<AgentRow> = sqlx::query_as(concat!(
                "SELECT ",
                agent_columns!(),
                " FROM agents WHERE CAST($1 AS TEXT) IS NULL OR workspace_id = $1"
            ))
            .bind(scope.map(AgentScope::workspace_id))
            .fetch_all(&self.pool)
            .await?;
            // Byte order, whatever the database's collation.
            rows.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
            rows.into_iter().map(AgentRow::into_stored).collect()
        }

        async fn remove_agent(
            &self,
            scope: &AgentScope,
            name: &str,
            audit: AuditRecord,
        ) -> Result<Option<StoredAgent>, SessionError> {
            let audit = &audit;
            retrying!(async {
                let mut tx = self.tx().await?;
                let row: Option<AgentRow> = sqlx::query_as(concat!(
                    "DELETE FROM agents WHERE workspace_id = $1 AND name = $2 RETURNING ",
                    agent_columns!()
                ))
                .bind(scope.workspace_id())
                .bind(name)
                .fetch_optional(tx.conn())
                .await?;
                let Some(row) = row else {
                    return Ok(None);
                };
                This::insert_audit(tx.conn(), audit).await?;
                tx.commit().await?;
                row.into_stored().map(Some)
            })
        }

        async fn find_agent(
            &self,
            workspace_id: &WorkspaceId,
            name: &str,
        ) -> Result<Option<StoredAgent>, SessionError> {
            let row: Option<AgentRow> = sqlx::query_as(concat!(
                "SELECT ",
                agent_columns!(),
                " FROM agents WHERE name = $1 AND workspace_id IN ($2, '') \
                 ORDER BY workspace_id = '' LIMIT 1"
            ))
            .bind(name)
            .bind(workspace_id)
            .fetch_optional(&self.pool)
            .await?;
            row.map(AgentRow::into_stored).transpose()
        }
    }
}
