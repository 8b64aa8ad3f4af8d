//! Stores opened directly, for tests of the `Store` contract on both
//! backends: a SQLite file in a temp dir, and a fresh PostgreSQL database.

use std::time::Duration;

use troupe_session_svc::{
    error::{QuotaLeft, SessionError},
    model::{Action, AuditRecord, NewSession, Principal, ProcessChange, SessionId, Trust},
    policy::{Admission, SpawnContext},
    shard::Shard,
    store::{Bounds, Fence, Holder, PgStore, SqliteStore, prelude::*},
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
        session_id: id.into(),
        workspace_id: "alpha".into(),
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

/// Admits any child, one level deeper than its parent, with no quota
/// counted and no deadline.
pub fn admit_child(ctx: &SpawnContext<'_>) -> Result<Admission, SessionError> {
    Ok(Admission {
        depth: ctx.parent.depth + 1,
        parent_spawn_tat_ms: ctx.parent.spawn_tat_ms,
        quota: QuotaLeft::default(),
        deadline_ms: None,
    })
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

/// The fence of a lease taken for an hour (a long one: tests are not about
/// its expiry), by a new holder.
pub async fn lease_fence<S: Store>(store: &S) -> Fence {
    store
        .acquire_lease(&Holder::generate(), Duration::from_secs(3600))
        .await
        .expect("lease")
        .expect("lease free")
}

/// A [`lease_fence`], with the embedded runner recorded
/// ([`crate::embedded_runner`]): what a test of the store alone holds
/// before it starts processes.
pub async fn fence<S: Store>(store: &S) -> Fence {
    let fence = lease_fence(store).await;
    crate::embedded_runner(store, &fence).await;
    fence
}

/// Prunes every shard's events to the fleet's newest `keep`, each shard
/// under a term of its own (`held`'s shard under `held`, the others taken
/// for the pruning: they must be free); returns the shards' pruning marks.
pub async fn prune_all<S: Store>(store: &S, held: &Fence, keep: u64) -> Vec<i64> {
    let holder = Holder::generate();
    let mut marks = Vec::new();
    for shard in Shard::all() {
        let fence = if shard == held.shard {
            held.clone()
        } else {
            store
                .acquire_shard(&holder, shard, Duration::from_secs(3600))
                .await
                .expect("shard")
                .expect("a free shard")
        };
        marks.push(store.prune_events(&fence, keep).await.expect("prune"));
    }
    marks
}

/// Starts `id`'s process and records its start (the runner's event 1).
pub async fn started<S: Store>(store: &S, fence: &Fence, id: &str) {
    store
        .start_process(fence, &id.into())
        .await
        .expect("process");
    store
        .record_process(fence, &id.into(), 1, ProcessChange::Started, 1024)
        .await
        .expect("started");
}

/// The driver's work in every shard, each session by its id alone.
#[derive(Debug, Default)]
pub struct Work {
    pub unstarted: Vec<String>,
    pub undelivered: Vec<String>,
    pub unstopped: Vec<String>,
    pub callbacks_due: Vec<String>,
    pub runner_lost: Vec<String>,
}

/// What [`ProcessStore::driver_work`] finds in every shard.
pub async fn work<S: Store>(store: &S) -> Work {
    let work = store
        .driver_work(troupe_session_svc::shard::ShardSet::ALL)
        .await
        .expect("the driver's work");
    let ids = |list: Vec<(troupe_session_svc::shard::Shard, SessionId)>| {
        list.into_iter().map(|(_, id)| id.to_string()).collect()
    };
    Work {
        unstarted: work
            .unstarted
            .into_iter()
            .map(|r| r.session_id.to_string())
            .collect(),
        undelivered: ids(work.undelivered),
        unstopped: ids(work.unstopped),
        callbacks_due: ids(work.callbacks_due),
        runner_lost: ids(work.runner_lost),
    }
}
