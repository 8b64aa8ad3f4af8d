//! The shards' leases (`LeaseStore`) on both backends: each shard taken by
//! one holder at a time, with its own epoch; shares that divide without
//! overlap; renewals and releases of some shards leaving the others'
//! terms alone; a given-up shard's old term refused; the replicas counted;
//! the driver's work read for the shards held only; and sessions written
//! without a shard given theirs.

use std::time::Duration;

use troupe_session_svc::{
    error::SessionError,
    model::{Action, Trust},
    shard::{SHARDS, Shard, ShardSet},
    store::{Fence, Holder, prelude::*, share_of},
};
use troupe_tests::stores::{self, postgres, sqlite};

const TTL: Duration = Duration::from_secs(60);

fn shards(fences: &[Fence]) -> Vec<u16> {
    fences.iter().map(|f| f.shard.index()).collect()
}

/// A workspace whose shard is `shard`.
fn workspace_in(shard: u16) -> String {
    (0..)
        .map(|i| format!("ws-{i}"))
        .find(|w| Shard::of(w).index() == shard)
        .expect("some workspace")
}

async fn root<S: Store>(store: &S, id: &str, workspace: &str) {
    let session = troupe_session_svc::model::NewSession {
        workspace_id: workspace.into(),
        ..stores::new_session(id, Trust::Direct)
    };
    store
        .create_root(
            session,
            None,
            stores::operator_audit(Action::CreateRootSession, id),
            &|_| Ok(Default::default()),
        )
        .await
        .expect("root");
}

async fn leases_divide_and_each_shard_has_its_own_term<S: Store>(store: &S) {
    let (a, b) = (Holder::named("a"), Holder::named("b"));
    let leases = store.shard_leases().await.unwrap();
    assert_eq!(leases.len(), usize::from(SHARDS), "a lease row per shard");
    assert!(leases.iter().all(|l| !l.live), "none held yet");

    // One replica's share of two, then the other's: no shard twice.
    let mine = store.acquire_shards(&a, 32, TTL).await.unwrap();
    assert_eq!(shards(&mine), (0..32).collect::<Vec<_>>());
    let theirs = store.acquire_shards(&b, 64, TTL).await.unwrap();
    assert_eq!(shards(&theirs), (32..64).collect::<Vec<_>>());
    assert!(store.acquire_shards(&a, 64, TTL).await.unwrap().is_empty());
    let three = Shard::new(3).unwrap();
    assert!(store.acquire_shard(&b, three, TTL).await.unwrap().is_none());

    // Half given up: the rest renew, the given-up ones no longer do, and
    // another takes them at once, each at its next epoch.
    let (given, kept) = mine.split_at(16);
    store.release_shards(given).await.unwrap();
    let renewed = store.renew_shards(&mine, TTL).await.unwrap();
    assert_eq!(
        renewed.iter().map(|s| s.index()).collect::<Vec<_>>(),
        shards(kept)
    );
    let taken = store.acquire_shards(&b, 64, TTL).await.unwrap();
    assert_eq!(shards(&taken), shards(given));
    for (old, new) in given.iter().zip(&taken) {
        assert_eq!(new.epoch, old.epoch + 1, "shard {}", old.shard);
    }
    // The given-up term's writes are refused; the kept ones' pass.
    match store.prune_events(&given[0], 1000).await {
        Err(SessionError::Fenced { epoch }) => assert_eq!(epoch, given[0].epoch),
        other => panic!("a given-up term wrote: {other:?}"),
    }
    store
        .prune_events(&kept[0], 1000)
        .await
        .expect("a kept term");
    store
        .prune_events(&taken[0], 1000)
        .await
        .expect("the new term");
    // A fence is checked against its own shard's row: a's old epoch of a
    // shard b now holds is refused though a holds others at that epoch.
    let stale = Fence {
        shard: taken[0].shard,
        ..kept[0].clone()
    };
    assert!(store.prune_events(&stale, 1000).await.is_err());
    let leases = store.shard_leases().await.unwrap();
    let held_by = |h: &Holder| leases.iter().filter(|l| l.live && &l.holder == h).count();
    assert_eq!((held_by(&a), held_by(&b)), (16, 48));
}

async fn replicas_are_counted_while_alive<S: Store>(store: &S) {
    let (a, b) = (Holder::named("a"), Holder::named("b"));
    let names =
        |live: Vec<Holder>| -> Vec<String> { live.iter().map(|h| h.as_str().to_owned()).collect() };
    assert_eq!(names(store.heartbeat(&a, TTL).await.unwrap()), ["a"]);
    assert_eq!(names(store.heartbeat(&b, TTL).await.unwrap()), ["a", "b"]);
    let live = store.heartbeat(&a, TTL).await.unwrap();
    assert_eq!(names(live.clone()), ["a", "b"], "counted once");
    assert_eq!(share_of(&live, &a) + share_of(&live, &b), 64);
    store.leave(&a).await.unwrap();
    assert_eq!(names(store.heartbeat(&b, TTL).await.unwrap()), ["b"]);
    // One that stops renewing is no longer counted.
    let brief = Holder::named("brief");
    store
        .heartbeat(&brief, Duration::from_millis(50))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(names(store.heartbeat(&b, TTL).await.unwrap()), ["b"]);
    let replicas = store.replicas().await.unwrap();
    let live: Vec<&str> = replicas
        .iter()
        .filter(|r| r.live)
        .map(|r| r.holder.as_str())
        .collect();
    assert_eq!(live, ["b"]);
}

async fn the_drivers_work_is_read_for_the_shards_held<S: Store>(store: &S) {
    let (w1, w2) = (workspace_in(1), workspace_in(40));
    root(store, "one", &w1).await;
    root(store, "forty", &w2).await;
    let unstarted = |work: troupe_session_svc::store::DriverWork| -> Vec<String> {
        work.unstarted
            .into_iter()
            .map(|r| r.session_id.to_string())
            .collect()
    };
    let only = |n: u16| -> ShardSet { [Shard::new(n).unwrap()].into_iter().collect() };
    let work = store.driver_work(only(1)).await.unwrap();
    assert_eq!(unstarted(work), ["one"]);
    let work = store.driver_work(only(40)).await.unwrap();
    assert_eq!(unstarted(work), ["forty"]);
    assert!(
        unstarted(store.driver_work(only(2)).await.unwrap()).is_empty(),
        "another shard's work"
    );
    let mut all = unstarted(store.driver_work(ShardSet::ALL).await.unwrap());
    all.sort();
    assert_eq!(all, ["forty", "one"]);
    // Shard 63 is the mask's sign bit.
    root(store, "last", &workspace_in(63)).await;
    assert_eq!(
        unstarted(store.driver_work(only(63)).await.unwrap()),
        ["last"]
    );
}

#[tokio::test]
async fn sqlite_leases_divide_and_each_shard_has_its_own_term() {
    let (_dir, store) = sqlite().await;
    leases_divide_and_each_shard_has_its_own_term(&store).await;
}

#[tokio::test]
async fn postgres_leases_divide_and_each_shard_has_its_own_term() {
    leases_divide_and_each_shard_has_its_own_term(&postgres().await).await;
}

#[tokio::test]
async fn sqlite_replicas_are_counted_while_alive() {
    let (_dir, store) = sqlite().await;
    replicas_are_counted_while_alive(&store).await;
}

#[tokio::test]
async fn postgres_replicas_are_counted_while_alive() {
    replicas_are_counted_while_alive(&postgres().await).await;
}

#[tokio::test]
async fn sqlite_the_drivers_work_is_read_for_the_shards_held() {
    let (_dir, store) = sqlite().await;
    the_drivers_work_is_read_for_the_shards_held(&store).await;
}

#[tokio::test]
async fn postgres_the_drivers_work_is_read_for_the_shards_held() {
    the_drivers_work_is_read_for_the_shards_held(&postgres().await).await;
}

/// Sessions a replica of an older release wrote (no shard: -1) are in no
/// shard's work until their shard is recorded.
#[tokio::test]
async fn postgres_sessions_written_without_a_shard_are_given_theirs() {
    let url = troupe_tests::postgres::fresh_database().await;
    let store = troupe_session_svc::store::PgStore::open(&url)
        .await
        .unwrap();
    let workspace = workspace_in(9);
    root(&store, "old", &workspace).await;
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    sqlx::query("UPDATE sessions SET shard = -1")
        .execute(&mut admin)
        .await
        .unwrap();
    let all = || async {
        store
            .driver_work(ShardSet::ALL)
            .await
            .unwrap()
            .unstarted
            .len()
    };
    assert_eq!(all().await, 0, "a session of no shard is no one's work");
    assert_eq!(store.shard_sessions().await.unwrap(), 1);
    assert_eq!(store.shard_sessions().await.unwrap(), 0, "once");
    let shard: i32 = sqlx::query_scalar("SELECT shard FROM sessions WHERE session_id = 'old'")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(shard, 9);
    assert_eq!(all().await, 1);
}

/// Rows a replica of an older release writes during a rolling update, on
/// PostgreSQL: the database's `troupe_shard` agrees with `Shard::of` (so a
/// session inserted without a shard is given its own), and events inserted
/// without a position (as older releases insert them) take their session's
/// shard and its next positions, in commit order: watchers of this release
/// see them, after what was there.
#[tokio::test]
async fn postgres_rows_of_an_older_release_take_their_shard_and_position() {
    use troupe_session_svc::{cursor::Cursor, model::EventFilter, store::EventPage};
    let url = troupe_tests::postgres::fresh_database().await;
    let store = troupe_session_svc::store::PgStore::open(&url)
        .await
        .unwrap();
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    for n in 0..300usize {
        let workspace = format!("w{n}-{}", "é".repeat(n % 3));
        let sql: i32 = sqlx::query_scalar("SELECT troupe_shard($1)")
            .bind(&workspace)
            .fetch_one(&mut admin)
            .await
            .unwrap();
        assert_eq!(sql, i32::from(Shard::of(&workspace).index()), "{workspace}");
    }
    let workspace = workspace_in(9);
    root(&store, "new", &workspace).await;
    let filter = EventFilter {
        workspace_id: Some(workspace.as_str().into()),
        ..EventFilter::default()
    };
    let page = |after: Cursor| {
        let (store, filter) = (&store, &filter);
        async move {
            match store.events_after(filter, &after, 100).await.unwrap() {
                EventPage::Events(events) => events,
                EventPage::Expired { .. } => panic!("nothing is pruned"),
            }
        }
    };
    let before = page(Cursor::default()).await;
    let last = before.last().expect("the root's events").position;
    for seq in [100, 101] {
        sqlx::query(
            "INSERT INTO events (id, session_id, seq, kind, status, at_ms, detail) \
             VALUES (nextval('events_id_seq'), 'new', $1, 'progress', 'pending', 0, '{}')",
        )
        .bind(seq)
        .execute(&mut admin)
        .await
        .expect("an older release's insert");
    }
    let after = page(Cursor::at([(Shard::of(&workspace), last)])).await;
    let got: Vec<(u16, i64, i64)> = after
        .iter()
        .map(|e| (e.shard.index(), e.position, e.seq))
        .collect();
    assert_eq!(got, [(9, last + 1, 100), (9, last + 2, 101)]);
}

/// A replica's driver is woken for work in the shards a commit on another
/// replica moved, and not by output: a spawn in a workspace of shard 9
/// marks shard 9 alone at the other store, a run of its agent's output
/// marks nothing there though it wakes the watchers of shard 9, and not
/// those of shard 10 (the poll included).
#[tokio::test]
async fn postgres_a_commits_work_wakes_other_replicas_for_its_shards_alone() {
    use troupe_session_svc::model::OutputChunk;
    let url = troupe_tests::postgres::fresh_database().await;
    let writer = troupe_session_svc::store::PgStore::open(&url)
        .await
        .unwrap();
    let other = troupe_session_svc::store::PgStore::open(&url)
        .await
        .unwrap();
    let wait = Duration::from_secs(10);
    other.take_work();
    let fence = stores::fence(&writer).await;
    let mut work = other.subscribe_work();
    work.borrow_and_update();
    root(&writer, "nine", &workspace_in(9)).await;
    tokio::time::timeout(wait, work.changed())
        .await
        .expect("woken")
        .unwrap();
    let marked: Vec<u16> = other.take_work().iter().map(|s| s.index()).collect();
    assert_eq!(marked, [9]);

    stores::started(&writer, &fence, "nine").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    other.take_work();
    let nine = troupe_session_svc::shard::Shard::new(9).unwrap();
    let ten = troupe_session_svc::shard::Shard::new(10).unwrap();
    let mut events = other.subscribe(ShardSet::of(nine));
    let mut elsewhere = other.subscribe(ShardSet::of(ten));
    let chunk = OutputChunk {
        runner_seq: 2,
        stream: "stdout",
        data: b"hello\n".to_vec(),
    };
    writer
        .record_outputs(&fence, &"nine".into(), &[chunk], 100)
        .await
        .unwrap();
    tokio::time::timeout(wait, events.changed())
        .await
        .expect("watchers woken")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(other.take_work().is_empty(), "output woke a driver");
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), elsewhere.changed())
            .await
            .is_err(),
        "a watcher of another shard was woken"
    );
}
