//! Stores opened directly, for tests of the `Store` contract on both
//! backends: a SQLite file in a temp dir, and a fresh PostgreSQL database.

use troupe_session_svc::store::{PgStore, SqliteStore};

/// A SQLite store on a new file; the dir lives as long as it is kept.
pub async fn sqlite() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().expect("dir");
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("troupe.db").display()
    );
    let store = SqliteStore::open(&url).await.expect("sqlite");
    (dir, store)
}

/// A PostgreSQL store on a fresh database ([`crate::postgres::fresh_database`]).
pub async fn postgres() -> PgStore {
    let url = crate::postgres::fresh_database().await;
    PgStore::open(&url).await.expect("postgres")
}
