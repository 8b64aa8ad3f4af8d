//! Stores opened directly, for tests of the `Store` contract on both
//! backends: a SQLite file in a temp dir, and a fresh PostgreSQL database.

use troupe_session_svc::{
    error::SessionError,
    model::{Action, AuditRecord, NewSession, Principal, Trust},
    store::{Bounds, PgStore, SqliteStore},
};

/// No bound on a message a test stores directly: no rate, any inbox.
pub const UNBOUNDED: Bounds<'static> = Bounds {
    throttle: None,
    inbox: &any_inbox,
};

fn any_inbox(_unread: u64, _bytes: u64) -> Result<(), SessionError> {
    Ok(())
}

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

/// A session to store in workspace `alpha`: agent `worker` running
/// `/bin/cat`, made by the operator, every option at its default. Tests
/// change what they need with struct update syntax.
pub fn new_session(id: &str, trust: Trust) -> NewSession {
    NewSession {
        session_id: id.to_owned(),
        workspace_id: "alpha".to_owned(),
        trust,
        agent_name: "worker".to_owned(),
        agent_command: "[\"/bin/cat\"]".to_owned(),
        title: id.to_owned(),
        created_by: Principal::Operator,
        trace: None,
        initial_message: None,
        notify_parent: false,
        budget: Default::default(),
        write_scope: Default::default(),
        on_parent_end: Default::default(),
    }
}

/// An allowed audit entry of the operator's.
pub fn operator_audit(action: Action, target: &str) -> AuditRecord {
    AuditRecord {
        caller: Principal::Operator,
        action,
        target: target.to_owned(),
        allowed: true,
        reason: "OK".to_owned(),
        detail: String::new(),
    }
}
