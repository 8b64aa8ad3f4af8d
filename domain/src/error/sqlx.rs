//! How a sqlx error becomes a [`SessionError`]: the one conversion every
//! sqlx backend uses (so `?` works on their statements), classifying the
//! failure by sqlx's variant and the database's own code: SQLite's result
//! code, PostgreSQL's SQLSTATE. It lives here, behind the `sqlx` feature
//! that only the store enables, because Rust lets only the crate of
//! [`SessionError`] or of `sqlx::Error` implement it.

use super::{SessionError, StorageError, StorageKind};

impl From<sqlx::Error> for SessionError {
    fn from(e: sqlx::Error) -> Self {
        SessionError::Storage(StorageError::new(classify(&e), e.to_string()))
    }
}

/// Tells a failure the caller should retry from one it should not.
pub fn classify(e: &sqlx::Error) -> StorageKind {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => StorageKind::Unavailable,
        sqlx::Error::Database(db) => {
            if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                db.code()
                    .and_then(|code| code.parse().ok())
                    .map_or(StorageKind::Other, sqlite_kind)
            } else if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                sqlstate_kind(pg.code())
            } else {
                StorageKind::Other
            }
        }
        _ => StorageKind::Other,
    }
}

/// SQLite's (extended) result code: busy or locked is a lost race for the
/// database (its primary code is the low byte).
fn sqlite_kind(code: i32) -> StorageKind {
    const SQLITE_BUSY: i32 = 5;
    const SQLITE_LOCKED: i32 = 6;
    match code & 0xff {
        SQLITE_BUSY | SQLITE_LOCKED => StorageKind::Conflict,
        _ => StorageKind::Other,
    }
}

/// PostgreSQL's SQLSTATE: connection exceptions (class 08), a server
/// shutting down or not yet accepting (57P01-57P03) and too many
/// connections (53300) are passing; serialization failures and deadlocks
/// (40001, 40P01) are lost races.
fn sqlstate_kind(state: &str) -> StorageKind {
    match state {
        "40001" | "40P01" => StorageKind::Conflict,
        "57P01" | "57P02" | "57P03" | "53300" => StorageKind::Unavailable,
        _ if state.starts_with("08") => StorageKind::Unavailable,
        _ => StorageKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sqlx::{Connection, SqliteConnection, sqlite::SqliteConnectOptions};
    use tonic::Code;
    use tonic_types::StatusExt;

    use super::*;

    #[test]
    fn a_lost_connection_or_pool_is_unavailable_and_a_bad_query_is_not() {
        for (e, kind) in [
            (sqlx::Error::PoolTimedOut, StorageKind::Unavailable),
            (sqlx::Error::PoolClosed, StorageKind::Unavailable),
            (sqlx::Error::WorkerCrashed, StorageKind::Unavailable),
            (
                sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into()),
                StorageKind::Unavailable,
            ),
            (sqlx::Error::RowNotFound, StorageKind::Other),
            (sqlx::Error::Protocol("garbled".into()), StorageKind::Other),
        ] {
            assert_eq!(classify(&e), kind, "{e}");
        }
    }

    #[test]
    fn sqlstates_of_passing_failures_and_lost_races() {
        for (state, kind) in [
            ("08006", StorageKind::Unavailable),
            ("08001", StorageKind::Unavailable),
            ("57P01", StorageKind::Unavailable),
            ("57P03", StorageKind::Unavailable),
            ("53300", StorageKind::Unavailable),
            ("40001", StorageKind::Conflict),
            ("40P01", StorageKind::Conflict),
            ("23505", StorageKind::Other),
            ("42P01", StorageKind::Other),
        ] {
            assert_eq!(sqlstate_kind(state), kind, "{state}");
        }
    }

    /// A database whose writer is held elsewhere answers busy: a conflict;
    /// a broken constraint is not.
    #[tokio::test]
    async fn sqlite_busy_is_a_conflict_and_a_constraint_is_other() {
        let dir = tempfile::tempdir().unwrap();
        let options = SqliteConnectOptions::new()
            .filename(dir.path().join("db"))
            .create_if_missing(true)
            .busy_timeout(Duration::ZERO);
        let mut holder = SqliteConnection::connect_with(&options).await.unwrap();
        sqlx::query("CREATE TABLE t (x INTEGER PRIMARY KEY)")
            .execute(&mut holder)
            .await
            .unwrap();
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut holder)
            .await
            .unwrap();
        let mut other = SqliteConnection::connect_with(&options).await.unwrap();
        let busy = sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut other)
            .await
            .unwrap_err();
        assert_eq!(classify(&busy), StorageKind::Conflict, "{busy}");
        sqlx::query("INSERT INTO t VALUES (1)")
            .execute(&mut holder)
            .await
            .unwrap();
        let duplicate = sqlx::query("INSERT INTO t VALUES (1)")
            .execute(&mut holder)
            .await
            .unwrap_err();
        assert_eq!(classify(&duplicate), StorageKind::Other, "{duplicate}");
    }

    /// What a caller is told: retry for an unavailable database, a bare
    /// internal error otherwise; never the database's own words.
    #[tokio::test]
    async fn an_unavailable_database_answers_unavailable_with_reason_unavailable() {
        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        pool.close().await;
        let closed = sqlx::query("SELECT 1").execute(&pool).await.unwrap_err();
        let status = tonic::Status::from(SessionError::from(closed));
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(
            status.get_details_error_info().map(|i| i.reason),
            Some("UNAVAILABLE".to_owned())
        );
        assert!(!status.message().contains("pool"), "{status:?}");

        let bad = sqlx::Error::Protocol("secret detail".into());
        let status = tonic::Status::from(SessionError::from(bad));
        assert_eq!(status.code(), Code::Internal, "{status:?}");
        assert_eq!(status.message(), "internal error");
    }
}
