//! Runners on PostgreSQL: registrations and their leases (on the
//! database's clock), the embedded runner's row, and the placement of a
//! session's process, decided by [`crate::placement::place`] in the
//! transaction that records the process. That transaction locks the
//! workspace's counter row first (the lock order of `locks`), so two
//! placements of one workspace take turns, on any replica; its
//! `workspace_runner` row is one per workspace (the key).

use std::time::Duration;

use sqlx::{PgConnection, Row};

use super::{PgStore, lease::check, locks};
use crate::{
    error::SessionError,
    model::{RunnerName, RunnerRow, RunnerSpec},
    placement::{Place, place},
    store::lease::{Fence, millis},
};

/// Every runner, with its liveness and its active sessions.
async fn load(conn: &mut PgConnection) -> Result<Vec<RunnerRow>, SessionError> {
    let rows = sqlx::query(
        "SELECT r.name, r.endpoint, r.capacity, r.lease_expires IS NULL AS is_static, \
           (r.lease_expires IS NULL OR r.lease_expires > clock_timestamp()) AS live, r.generation, \
           (SELECT count(*) FROM processes p JOIN sessions s USING (session_id) \
            WHERE p.runner = r.name AND s.status IN ('pending', 'running')) AS active \
         FROM runners r ORDER BY r.name",
    )
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(RunnerRow {
                name: RunnerName::stored(row.try_get("name")?),
                endpoint: row.try_get("endpoint")?,
                capacity: row
                    .try_get::<i64, _>("capacity")?
                    .clamp(0, i64::from(u32::MAX)) as u32,
                is_static: row.try_get("is_static")?,
                live: row.try_get("live")?,
                generation: row.try_get("generation")?,
                active: row.try_get::<i64, _>("active")?.max(0) as u32,
            })
        })
        .collect()
}

impl PgStore {
    pub(in crate::store) async fn register_runner_once(
        &self,
        spec: &RunnerSpec,
        ttl: Duration,
    ) -> Result<i64, SessionError> {
        let generation: Option<i64> = sqlx::query_scalar(
            "INSERT INTO runners (name, endpoint, capacity, lease_expires, generation) \
             VALUES ($1, $2, $3, clock_timestamp() + make_interval(secs => $4::float8 / 1000), 1) \
             ON CONFLICT (name) DO UPDATE SET endpoint = EXCLUDED.endpoint, \
               capacity = EXCLUDED.capacity, lease_expires = EXCLUDED.lease_expires, \
               generation = runners.generation + CASE WHEN runners.lease_expires <= clock_timestamp() \
                 OR runners.endpoint != EXCLUDED.endpoint THEN 1 ELSE 0 END \
             WHERE runners.lease_expires IS NOT NULL RETURNING generation",
        )
        .bind(spec.name.as_str())
        .bind(&spec.endpoint)
        .bind(i64::from(spec.capacity))
        .bind(millis(ttl))
        .fetch_optional(&self.pool)
        .await?;
        generation.ok_or_else(|| {
            SessionError::invalid("name", format!("runner name {} is taken", spec.name))
        })
    }

    pub(in crate::store) async fn runners_impl(&self) -> Result<Vec<RunnerRow>, SessionError> {
        load(&mut *self.pool.acquire().await?).await
    }

    pub(in crate::store) async fn set_static_runner_once(
        &self,
        fence: &Fence,
        spec: Option<&RunnerSpec>,
    ) -> Result<(), SessionError> {
        let mut tx = self.begin().await?;
        check(&mut tx, fence).await?;
        sqlx::query("DELETE FROM runners WHERE lease_expires IS NULL")
            .execute(&mut *tx)
            .await?;
        if let Some(spec) = spec {
            sqlx::query(
                "INSERT INTO runners (name, endpoint, capacity, lease_expires) \
                 VALUES ($1, $2, $3, NULL) \
                 ON CONFLICT (name) DO UPDATE SET endpoint = EXCLUDED.endpoint, \
                   capacity = EXCLUDED.capacity, lease_expires = NULL",
            )
            .bind(spec.name.as_str())
            .bind(&spec.endpoint)
            .bind(i64::from(spec.capacity))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Records the process of a session about to start, on the runner
    /// placement chooses (its earlier choice, if it has a process already).
    pub(in crate::store) async fn start_process_once(
        &self,
        fence: &Fence,
        session_id: &str,
    ) -> Result<Place, SessionError> {
        let mut tx = self.begin().await?;
        check(&mut tx, fence).await?;
        let workspace_id = match locks::place(&mut tx, session_id).await {
            Ok((workspace_id, _)) => workspace_id,
            Err(SessionError::SessionNotFound { .. }) => return Ok(Place::Wait),
            Err(e) => return Err(e),
        };
        // Placements of one workspace take turns at its counter row.
        locks::workspace(&mut tx, &workspace_id).await?;
        let placed: Option<Option<String>> =
            sqlx::query_scalar("SELECT runner FROM processes WHERE session_id = $1")
                .bind(session_id)
                .fetch_optional(&mut *tx)
                .await?;
        if let Some(Some(runner)) = placed {
            tx.commit().await?;
            return Ok(Place::On(RunnerName::stored(runner)));
        }
        let current: Option<String> =
            sqlx::query_scalar("SELECT runner FROM workspace_runner WHERE workspace_id = $1")
                .bind(&workspace_id)
                .fetch_optional(&mut *tx)
                .await?;
        let busy =
            match &current {
                Some(runner) => sqlx::query_scalar::<_, bool>(
                    "SELECT EXISTS (SELECT 1 FROM processes p JOIN sessions s USING (session_id) \
                 WHERE s.workspace_id = $1 AND p.runner = $2 AND s.session_id != $3 \
                 AND s.status IN ('pending', 'running'))",
                )
                .bind(&workspace_id)
                .bind(runner)
                .bind(session_id)
                .fetch_one(&mut *tx)
                .await?,
                None => false,
            };
        let runners = load(&mut tx).await?;
        let current = current.map(RunnerName::stored);
        let decided = place(current.as_ref(), busy, &runners);
        if let Place::On(runner) = &decided {
            sqlx::query(
                "INSERT INTO workspace_runner (workspace_id, runner) VALUES ($1, $2) \
                 ON CONFLICT (workspace_id) DO UPDATE SET runner = EXCLUDED.runner",
            )
            .bind(&workspace_id)
            .bind(runner.as_str())
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO processes (session_id, notify_parent, runner) \
                 SELECT session_id, notify_parent, $2 FROM sessions WHERE session_id = $1 \
                 ON CONFLICT (session_id) DO UPDATE SET runner = EXCLUDED.runner",
            )
            .bind(session_id)
            .bind(runner.as_str())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(decided)
    }
}
