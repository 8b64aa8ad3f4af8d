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

/// Creates a database named `troupe_<pid>_<random>` on the admin server and
/// returns its URL (the admin URL with the database name replaced).
///
/// Nothing drops a test's database when the test ends (its servers may
/// still hold connections). Instead each call first drops the databases of
/// processes of this machine that have exited ([`drop_orphans`]): a test
/// binary's databases live until the next binary's first one, and a full
/// run's disk stays that of one binary.
pub async fn fresh_database() -> String {
    let admin = admin_url();
    let name = format!(
        "troupe_{}_{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    );
    let mut connection = PgConnection::connect(&admin)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {URL_ENV}={admin}: {e}"));
    drop_orphans(&mut connection).await;
    // `name` is ours: a fixed prefix, digits and hex digits.
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut connection)
        .await
        .unwrap_or_else(|e| panic!("cannot create database {name} on {admin}: {e}"));
    let _ = connection.close().await;
    with_database(&admin, &name)
}

/// Drops the `troupe_<pid>_…` databases whose process no longer runs on
/// this machine. A database someone is connected to is not dropped
/// (`DROP DATABASE` without `FORCE` refuses it), nor one whose name does
/// not carry a pid, nor any when this machine cannot tell (no `/proc`).
pub async fn drop_orphans(connection: &mut PgConnection) {
    if !std::path::Path::new("/proc/self").exists() {
        return;
    }
    let names: Vec<String> =
        sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE 'troupe\\_%'")
            .fetch_all(&mut *connection)
            .await
            .unwrap_or_default();
    for name in names {
        let Some(pid) = owner_pid(&name) else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        // Another test may drop it first, or still be connected: either way it is left.
        let _ = sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}")))
            .execute(&mut *connection)
            .await;
    }
}

/// The pid in a test database's name `troupe_<pid>_<hex>`, if it has that form.
pub fn owner_pid(name: &str) -> Option<u32> {
    let (pid, rest) = name.strip_prefix("troupe_")?.split_once('_')?;
    let well_formed = !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_hexdigit());
    well_formed.then(|| pid.parse().ok()).flatten()
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
    fn only_names_of_the_test_form_carry_an_owner() {
        assert_eq!(owner_pid("troupe_4242_0af3"), Some(4242));
        for name in [
            "troupe_0af3",
            "troupe_x_0af3",
            "troupe_4242_",
            "troupe_4242_0af3; DROP",
            "postgres",
        ] {
            assert_eq!(owner_pid(name), None, "{name}");
        }
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
