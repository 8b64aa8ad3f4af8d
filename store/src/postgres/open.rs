//! Opening the store: the pool, the migrations (under PostgreSQL's migration
//! lock, so replicas starting together migrate once), the wake-up tasks. Messages and logs name the URL without
//! its password ([`redacted`]).

use std::{str::FromStr, sync::Arc, time::Duration};

use sqlx::{
    Connection, PgConnection,
    postgres::{PgConnectOptions, PgPoolOptions},
};
use tokio::sync::watch;

use super::{POOL_SIZE, PgStore, wake};
use crate::{OutputBudget, error::SessionError, model::SessionRow};

/// Expands to the session columns, in [`RawSession`]'s field order, for `concat!`.
macro_rules! session_columns {
    () => {
        "row_id, session_id, workspace_id, parent_session_id, parent_trust_level, tree_id, \
         depth, trust_level, agent_name, agent_command, title, status, created_by, created_at_ms, \
         ended_at_ms, end_reason, spawn_tat_ms, inbox_seq, traceparent, spawn_span_id, writable_paths, on_parent_end, orphaned, children"
    };
}
pub(super) use session_columns;

/// Whether `url` names a PostgreSQL database (`postgres://`, `postgresql://`).
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// `url` without its password, for messages and logs.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    // The credentials end at the last `@` before the path.
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
        None => url.to_owned(),
    }
}

/// How long the server lets a connection of this service sit idle inside
/// a transaction before it ends the connection (rolling the transaction
/// back). No statement of a transaction here waits on anything but the
/// database, so only a stalled process (paused, swapped out) gets near it.
/// A stalled owner of the background work holds the lease row `FOR SHARE`
/// in its open write, which every takeover must wait for: such a write
/// lowers the limit to its term's time to live (`lease::check`).
pub(crate) const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(5);

impl PgStore {
    /// Connects to the database at `url` (a pool of [`POOL_SIZE`]), runs the
    /// migrations and starts the tasks that wake watchers on other
    /// replicas' commits. Errors name the URL without its password.
    pub async fn open(url: &str) -> Result<Self, SessionError> {
        let shown = redacted(url);
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| {
                SessionError::Internal(format!("bad database url {shown}: {}", strip(&e, url)))
            })?
            .options([(
                "idle_in_transaction_session_timeout",
                IDLE_IN_TRANSACTION.as_millis().to_string(),
            )]);
        // One connection first: an unreachable server fails the start at
        // once (the pool would retry until its acquire timeout).
        PgConnection::connect_with(&options)
            .await
            .map_err(|e| {
                SessionError::Internal(format!(
                    "cannot connect to database {shown}: {}",
                    strip(&e, url)
                ))
            })?
            .close()
            .await?;
        let pool = PgPoolOptions::new()
            .max_connections(POOL_SIZE)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.clone())
            .await
            .map_err(|e| {
                SessionError::Internal(format!(
                    "cannot connect to database {shown}: {}",
                    strip(&e, url)
                ))
            })?;
        // sqlx's PostgreSQL migrator holds an advisory lock while it runs:
        // replicas starting together apply each migration once.
        sqlx::migrate!("./migrations/postgres")
            .run(&pool)
            .await
            .map_err(|e| SessionError::Internal(format!("migration of {shown} failed: {e}")))?;
        let events_written = crate::changes::Changes::default();
        let (sessions_ended, _) = watch::channel(0);
        let work = crate::work::WorkSignal::default();
        let tasks = wake::start(
            &pool,
            options,
            wake::Wakes {
                changes: events_written.clone(),
                ends: sessions_ended.clone(),
                work: work.clone(),
            },
        )
        .await?;
        Ok(PgStore {
            pool,
            output_budget: OutputBudget::default(),
            events_written,
            sessions_ended,
            work,
            tasks: Arc::new(tasks),
        })
    }

    /// Sets how much agents' output is kept ([`OutputBudget::default`]
    /// unless set).
    pub fn with_output_budget(mut self, budget: OutputBudget) -> Self {
        self.output_budget = budget;
        self
    }
}

/// An error's text, with the URL it may quote redacted.
fn strip(error: &dyn std::fmt::Display, url: &str) -> String {
    error.to_string().replace(url, &redacted(url))
}

pub(super) use crate::session_rows::RawSession;

/// Reads session rows from a statement's result.
pub(super) fn rows(raw: Vec<RawSession>) -> Result<Vec<SessionRow>, SessionError> {
    raw.into_iter().map(RawSession::into_row).collect()
}

#[cfg(test)]
mod tests {
    use super::redacted;

    #[test]
    fn urls_lose_their_password_only() {
        assert_eq!(
            redacted("postgres://troupe:s3cret@db:5432/troupe"),
            "postgres://troupe:***@db:5432/troupe"
        );
        assert_eq!(
            redacted("postgresql://a:b@c@host/db?sslmode=disable"),
            "postgresql://a:***@host/db?sslmode=disable"
        );
        assert_eq!(
            redacted("postgres://troupe@db/troupe"),
            "postgres://troupe@db/troupe"
        );
        assert_eq!(redacted("postgres://db/troupe"), "postgres://db/troupe");
    }
}
