//! The database the test servers use: SQLite in each server's data
//! directory (the default), or, with `TROUPE_TEST_BACKEND=postgres`, a fresh
//! PostgreSQL database per [`crate::TestServer`], made through the server at
//! `TROUPE_TEST_POSTGRES_URL` (`scripts/pg-env` starts one and exports it).

use sqlx::{AssertSqlSafe, Connection, postgres::PgConnection};

/// Names the backend every test server uses: `sqlite` (default) or `postgres`.
pub const BACKEND_ENV: &str = "TROUPE_TEST_BACKEND";
/// A PostgreSQL URL whose user may create databases (the admin URL).
pub const URL_ENV: &str = "TROUPE_TEST_POSTGRES_URL";

/// Where the test servers keep their data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// SQLite at `<data-dir>/troupe.db`, one database per server.
    Sqlite,
    /// A fresh PostgreSQL database per test server, which its replicas share.
    Postgres,
}

impl Backend {
    /// Returns the backend `TROUPE_TEST_BACKEND` names (see [`Backend::parse`]).
    pub fn from_env() -> Backend {
        match std::env::var(BACKEND_ENV) {
            Err(std::env::VarError::NotPresent) => Backend::parse(None),
            Ok(text) => Backend::parse(Some(&text)),
            Err(e) => panic!("{BACKEND_ENV} is not readable: {e}"),
        }
    }

    /// Returns the backend `text` names: `sqlite` (also when unset or
    /// empty) or `postgres`; panics on anything else.
    pub fn parse(text: Option<&str>) -> Backend {
        match text.map(str::trim) {
            None | Some("" | "sqlite") => Backend::Sqlite,
            Some("postgres") => Backend::Postgres,
            Some(other) => panic!(
                "{BACKEND_ENV}={other:?} is not a test backend: use sqlite (the default) or postgres"
            ),
        }
    }
}

/// Returns `TROUPE_TEST_POSTGRES_URL`; panics, saying how to get one, when it is unset.
pub fn admin_url() -> String {
    match std::env::var(URL_ENV) {
        Ok(url) if !url.trim().is_empty() => url.trim().to_owned(),
        _ => panic!(
            "{URL_ENV} is not set: the PostgreSQL tests need a server whose user may create \
             databases; `source scripts/pg-env` starts a private one and sets it"
        ),
    }
}

/// Creates a database named `troupe_<random>` on the admin server and
/// returns its URL (the admin URL with the database name replaced).
pub async fn fresh_database() -> String {
    let admin = admin_url();
    let name = format!("troupe_{}", uuid::Uuid::new_v4().simple());
    let mut connection = PgConnection::connect(&admin)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {URL_ENV}={admin}: {e}"));
    // `name` is ours: a fixed prefix and hex digits.
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut connection)
        .await
        .unwrap_or_else(|e| panic!("cannot create database {name} on {admin}: {e}"));
    let _ = connection.close().await;
    with_database(&admin, &name)
}

/// Returns `url` naming database `name` instead of its own (query kept).
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_at = base.find("://").map_or(0, |i| i + 3);
    let root = match base[authority_at..].find('/') {
        Some(slash) => &base[..authority_at + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{root}/{name}?{query}"),
        None => format!("{root}/{name}"),
    }
}

/// Whether `url` is a PostgreSQL one.
pub fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backend_defaults_to_sqlite() {
        assert_eq!(Backend::parse(None), Backend::Sqlite);
        assert_eq!(Backend::parse(Some("")), Backend::Sqlite);
        assert_eq!(Backend::parse(Some("sqlite")), Backend::Sqlite);
        assert_eq!(Backend::parse(Some("postgres")), Backend::Postgres);
    }

    #[test]
    #[should_panic(expected = "TROUPE_TEST_BACKEND=\"mysql\" is not a test backend")]
    fn an_unknown_backend_is_a_clear_panic() {
        Backend::parse(Some("mysql"));
    }

    #[test]
    fn the_database_name_is_replaced_and_the_rest_kept() {
        assert_eq!(
            with_database("postgres://troupe@127.0.0.1:5432/postgres", "troupe_1"),
            "postgres://troupe@127.0.0.1:5432/troupe_1"
        );
        assert_eq!(
            with_database("postgres://u:p@h:1/postgres?sslmode=disable", "x"),
            "postgres://u:p@h:1/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h:1", "x"), "postgres://h:1/x");
    }
}
