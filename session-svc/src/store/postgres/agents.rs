//! What the replicas on a database share: the operator token and agent
//! definitions. Each write is one transaction with its audit entry; the
//! statements are atomic across replicas by themselves (`ON CONFLICT`).

use super::{PgStore, events::insert_audit};
use crate::{
    error::SessionError,
    model::{AgentScope, AuditRecord, NewAgent, OperatorToken, StoredAgent, now_ms},
    store::agent_rows::{AgentRow, agent_columns, command_json, env_json},
};

impl PgStore {
    pub(super) async fn claim_operator_token_impl(
        &self,
        candidate: &OperatorToken,
    ) -> Result<OperatorToken, SessionError> {
        // Never replaces a stored token: of replicas starting together, the
        // first insert wins and every one reads it back.
        sqlx::query(
            "INSERT INTO operator_token (id, token, created_at_ms) VALUES (1, $1, $2) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(candidate.expose())
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        let stored: String = sqlx::query_scalar("SELECT token FROM operator_token WHERE id = 1")
            .fetch_one(&self.pool)
            .await?;
        OperatorToken::new(&stored)
            .ok_or_else(|| SessionError::Internal("the stored operator token is too short".into()))
    }

    pub(super) async fn apply_agent_once(
        &self,
        agent: &NewAgent,
        audit: &AuditRecord,
    ) -> Result<StoredAgent, SessionError> {
        let env = env_json(agent)?;
        let command = command_json(agent)?;
        let mut tx = self.begin().await?;
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
        .fetch_one(&mut *tx)
        .await?;
        insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        row.into_stored()
    }

    pub(super) async fn list_agents_impl(
        &self,
        scope: Option<&AgentScope>,
    ) -> Result<Vec<StoredAgent>, SessionError> {
        let rows: Vec<AgentRow> = sqlx::query_as(concat!(
            "SELECT ",
            agent_columns!(),
            " FROM agents WHERE $1::text IS NULL OR workspace_id = $1 \
             ORDER BY workspace_id COLLATE \"C\", name COLLATE \"C\""
        ))
        .bind(scope.map(AgentScope::workspace_id))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(AgentRow::into_stored).collect()
    }

    pub(super) async fn remove_agent_once(
        &self,
        scope: &AgentScope,
        name: &str,
        audit: &AuditRecord,
    ) -> Result<Option<StoredAgent>, SessionError> {
        let mut tx = self.begin().await?;
        let row: Option<AgentRow> = sqlx::query_as(concat!(
            "DELETE FROM agents WHERE workspace_id = $1 AND name = $2 RETURNING ",
            agent_columns!()
        ))
        .bind(scope.workspace_id())
        .bind(name)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        row.into_stored().map(Some)
    }

    pub(super) async fn find_agent_impl(
        &self,
        workspace_id: &str,
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
