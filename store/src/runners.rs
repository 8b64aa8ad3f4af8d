//! Runners, written once for both backends (see `backends`): registrations
//! and their leases (expiries in milliseconds on the database's clock,
//! `db_now_ms!`), the embedded runner's row, and the placement of a
//! session's process, decided by [`crate::placement::place`] in the
//! transaction that records the process. That transaction first takes the
//! session's workspace (`Tx::lock_placement`: on PostgreSQL its counter
//! row, the lock order of `postgres::locks`, so two placements of one
//! workspace take turns on any replica; on SQLite the writer lock
//! serialises every placement); `workspace_runner` holds one row per
//! workspace (the key).

use std::future::Future;

use super::{Fence, backends::each_backend};
use crate::{
    error::SessionError,
    model::{RunnerRow, RunnerSpec, SessionId},
    placement::Place,
};

/// Runners and the placement of processes on them; every [`super::Store`] is one.
pub trait RunnerStore: Send + Sync {
    /// Creates the process record of a session about to start, with the
    /// session's CALLBACK choice, on the runner [`crate::placement::place`]
    /// chooses for its workspace (and places the workspace there), in one
    /// transaction; if it exists, returns the runner it was placed on.
    /// [`Place::Wait`] (nothing written): no runner can take it now.
    fn start_process(
        &self,
        fence: &Fence,
        session_id: &SessionId,
    ) -> impl Future<Output = Result<Place, SessionError>> + Send;

    /// Registers a runner, or renews its lease, until `ttl` from now on the
    /// database's clock; returns its generation, bumped when it registers
    /// after its lease lapsed or under a new endpoint. The embedded
    /// runner's name is refused (INVALID_ARGUMENT).
    fn register_runner(
        &self,
        spec: &RunnerSpec,
        ttl: std::time::Duration,
    ) -> impl Future<Output = Result<i64, SessionError>> + Send;

    /// Returns every runner, with its liveness and active sessions, by name.
    fn runners(&self) -> impl Future<Output = Result<Vec<RunnerRow>, SessionError>> + Send;

    /// Makes `spec` the embedded runner (no lease), removing any other
    /// embedded one; `None` removes it. Background work: fenced.
    fn set_static_runner(
        &self,
        fence: &Fence,
        spec: Option<&RunnerSpec>,
    ) -> impl Future<Output = Result<(), SessionError>> + Send;
}

each_backend! {


    use sqlx::Row;

    use crate::{
        error::SessionError,
        model::{RunnerName, RunnerRow, RunnerSpec},
        placement::{Place, place},
        lease::{Fence, millis},
    };

    /// Every runner, with its liveness and its active sessions.
    async fn load(conn: &mut Conn) -> Result<Vec<RunnerRow>, SessionError> {
        let rows = sqlx::query(concat!(
            "SELECT r.name, r.endpoint, r.capacity, r.lease_expires_ms IS NULL AS is_static, \
               (r.lease_expires_ms IS NULL OR r.lease_expires_ms > ",
            db_now_ms!(),
            ") AS live, r.generation, \
               (SELECT count(*) FROM processes p JOIN sessions s USING (session_id) \
                WHERE p.runner = r.name AND s.status IN ('pending', 'running')) AS active \
             FROM runners r ORDER BY r.name"
        ))
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

    impl RunnerStore for This {
        /// Records the process of a session about to start, on the runner
        /// placement chooses (its earlier choice, if it has a process
        /// already); an unknown session waits.
        async fn start_process(
            &self,
            fence: &Fence,
            session_id: &SessionId,
        ) -> Result<Place, SessionError> {
            retrying!(async {
                let mut tx = self.tx().await?;
                This::check_fence(tx.conn(), fence).await?;
                let Some(workspace_id) = tx.lock_placement(session_id).await? else {
                    return Ok(Place::Wait);
                };
                let placed: Option<Option<String>> =
                    sqlx::query_scalar("SELECT runner FROM processes WHERE session_id = $1")
                        .bind(session_id)
                        .fetch_optional(tx.conn())
                        .await?;
                if let Some(Some(runner)) = placed {
                    tx.commit().await?;
                    return Ok(Place::On(RunnerName::stored(runner)));
                }
                let current: Option<String> =
                    sqlx::query_scalar("SELECT runner FROM workspace_runner WHERE workspace_id = $1")
                        .bind(&workspace_id)
                        .fetch_optional(tx.conn())
                        .await?;
                let busy = match &current {
                    Some(runner) => {
                        sqlx::query_scalar::<_, bool>(
                            "SELECT EXISTS (SELECT 1 FROM processes p JOIN sessions s USING (session_id) \
                             WHERE s.workspace_id = $1 AND p.runner = $2 AND s.session_id != $3 \
                             AND s.status IN ('pending', 'running'))",
                        )
                        .bind(&workspace_id)
                        .bind(runner)
                        .bind(session_id)
                        .fetch_one(tx.conn())
                        .await?
                    }
                    None => false,
                };
                let runners = load(tx.conn()).await?;
                let current = current.map(RunnerName::stored);
                let decided = place(current.as_ref(), busy, &runners);
                if let Place::On(runner) = &decided {
                    sqlx::query(
                        "INSERT INTO workspace_runner (workspace_id, runner) VALUES ($1, $2) \
                         ON CONFLICT (workspace_id) DO UPDATE SET runner = excluded.runner",
                    )
                    .bind(&workspace_id)
                    .bind(runner.as_str())
                    .execute(tx.conn())
                    .await?;
                    sqlx::query(
                        "INSERT INTO processes (session_id, notify_parent, runner) \
                         SELECT session_id, notify_parent, $2 FROM sessions WHERE session_id = $1 \
                         ON CONFLICT (session_id) DO UPDATE SET runner = excluded.runner",
                    )
                    .bind(session_id)
                    .bind(runner.as_str())
                    .execute(tx.conn())
                    .await?;
                }
                tx.commit().await?;
                Ok(decided)
            })
        }

        /// `RunnerStore::register_runner`: a runner's registration, or its
        /// renewal; its generation moves on after a lapse or under a new
        /// endpoint. The embedded runner's name is refused.
        async fn register_runner(
            &self,
            spec: &RunnerSpec,
            ttl: std::time::Duration,
        ) -> Result<i64, SessionError> {
            retrying!(async {
                let generation: Option<i64> = sqlx::query_scalar(concat!(
                    "INSERT INTO runners (name, endpoint, capacity, lease_expires_ms, generation) \
                     VALUES ($1, $2, $3, ",
                    db_now_ms!(),
                    " + $4, 1) \
                     ON CONFLICT (name) DO UPDATE SET endpoint = excluded.endpoint, \
                       capacity = excluded.capacity, lease_expires_ms = excluded.lease_expires_ms, \
                       generation = runners.generation + CASE WHEN runners.lease_expires_ms <= ",
                    db_now_ms!(),
                    " OR runners.endpoint != excluded.endpoint THEN 1 ELSE 0 END \
                     WHERE runners.lease_expires_ms IS NOT NULL RETURNING generation"
                ))
                .bind(spec.name.as_str())
                .bind(&spec.endpoint)
                .bind(i64::from(spec.capacity))
                .bind(millis(ttl))
                .fetch_optional(&mut *self.write_conn().await?)
                .await?;
                generation.ok_or_else(|| {
                    SessionError::invalid("name", format!("runner name {} is taken", spec.name))
                })
            })
        }

        async fn runners(&self) -> Result<Vec<RunnerRow>, SessionError> {
            load(&mut *self.pool.acquire().await?).await
        }

        /// `RunnerStore::set_static_runner`: the embedded runner's row (none:
        /// gone), fenced.
        async fn set_static_runner(
            &self,
            fence: &Fence,
            spec: Option<&RunnerSpec>,
        ) -> Result<(), SessionError> {
            retrying!(async {
                let mut tx = self.tx().await?;
                This::check_fence(tx.conn(), fence).await?;
                sqlx::query("DELETE FROM runners WHERE lease_expires_ms IS NULL")
                    .execute(tx.conn())
                    .await?;
                if let Some(spec) = spec {
                    sqlx::query(
                        "INSERT INTO runners (name, endpoint, capacity, lease_expires_ms) \
                         VALUES ($1, $2, $3, NULL) \
                         ON CONFLICT (name) DO UPDATE SET endpoint = excluded.endpoint, \
                           capacity = excluded.capacity, lease_expires_ms = NULL",
                    )
                    .bind(spec.name.as_str())
                    .bind(&spec.endpoint)
                    .bind(i64::from(spec.capacity))
                    .execute(tx.conn())
                    .await?;
                }
                tx.commit().await
            })
        }
    }
}
