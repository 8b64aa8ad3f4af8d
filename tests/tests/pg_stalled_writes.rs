//! `PgStore` writes that stop midway. Dropped at every point of their
//! first round trips (a caller that hung up, a term that ended), none
//! leaves a pooled connection inside a transaction: such a connection
//! would be handed out again, run later callers' statements inside that
//! transaction and keep their locks (the lease row's, say) for as long as
//! it is busy. An owner stopped inside a write of its term (never polled
//! again, as a paused process is not) holds the next owner back no longer
//! than its term's time to live, and the next owner's tries meanwhile fail
//! at once rather than wait (a term that waited would start expired); its
//! renewals meanwhile never wait behind it.
//!
//! PostgreSQL only: `TROUPE_TEST_POSTGRES_URL` (`source scripts/pg-env`).

use std::{
    future::Future,
    pin::Pin,
    task::Poll,
    time::{Duration, Instant},
};

use sqlx::{Connection, PgConnection};
use troupe_session_svc::{
    error::SessionError,
    store::{Fence, Holder, PgStore, prelude::*},
};

/// The store's connections name themselves so, to be told from the test's.
const APP: &str = "cancelled-writes";

/// The store's connections that are inside a transaction.
async fn in_transaction(admin: &mut PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND application_name = $1 AND state LIKE 'idle in transaction%'",
    )
    .bind(APP)
    .fetch_one(admin)
    .await
    .expect("activity")
}

/// A fresh database, a store on it whose connections are named [`APP`],
/// an admin connection, and the store's term of the fleet shard's lease
/// for `ttl`.
async fn owner(ttl: Duration) -> (String, PgStore, PgConnection, Fence) {
    let url = troupe_tests::postgres::fresh_database().await;
    let store = PgStore::open(&format!("{url}?application_name={APP}"))
        .await
        .expect("open");
    let admin = PgConnection::connect(&url).await.expect("admin");
    let fence = store
        .acquire_lease(&Holder::generate(), ttl)
        .await
        .expect("lease")
        .expect("lease free");
    (url, store, admin, fence)
}

/// Waits until none of the store's connections runs a statement.
async fn settled(admin: &mut PgConnection) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let active: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND application_name = $1 AND state = 'active'",
        )
        .bind(APP)
        .fetch_one(&mut *admin)
        .await
        .expect("activity");
        if active == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "a statement never ended");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_dropped_midway_leave_no_connection_in_a_transaction() {
    let (_url, store, mut admin, fence) = owner(Duration::from_secs(3600)).await;
    // Each write is polled a few times, the database given a moment to
    // answer in between, then dropped: from before its connection is
    // taken to after its `BEGIN` was sent and before its answer is read.
    // What a dropped write left is settled as its connection goes back to
    // the pool, within moments (the server would only end a transaction
    // left open after `IDLE_IN_TRANSACTION`, 5 s; and the next write that
    // takes the connection would commit it).
    let mut dropped = 0;
    for i in 0..300u32 {
        let mut write = Box::pin(store.prune_events(&fence, 1000));
        let mut done = false;
        for _ in 0..=i % 4 {
            if let Poll::Ready(result) = futures::poll!(&mut write) {
                result.expect("prune");
                done = true;
                break;
            }
            std::thread::sleep(Duration::from_micros(u64::from(i % 5) * 200));
        }
        drop(write);
        dropped += u32::from(!done);
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            let open = in_transaction(&mut admin).await;
            if open == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "write {i}, dropped, left {open} pooled connections inside a transaction"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert!(dropped > 100, "only {dropped} writes were dropped midway");
    // And every connection of the pool still serves writes.
    for _ in 0..20 {
        store.prune_events(&fence, 1000).await.expect("prune");
    }
}

/// A fenced write of `fence`'s term, begun and stopped once its
/// transaction holds the lease row: polled, a round trip at a time, until
/// then, never again after (its process, as the database sees it,
/// stopped). A poll may run through more than one round trip when the
/// database answers while it still runs (a busy machine): a write that thus
/// ends before it is caught holding the row is let be, and another tried.
async fn stopped_write<'a>(
    owner: &'a PgStore,
    fence: &'a Fence,
    admin: &mut PgConnection,
) -> Pin<Box<dyn Future<Output = Result<i64, SessionError>> + Send + 'a>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    'caught: loop {
        assert!(
            owner.renew_lease(fence, TTL).await.expect("renew"),
            "the term ended before a write was caught"
        );
        let mut write = Box::pin(owner.prune_events(fence, 1000));
        loop {
            match futures::poll!(&mut write) {
                Poll::Ready(Ok(_)) => continue 'caught,
                Poll::Ready(Err(e)) => panic!("the write failed before it was stopped: {e:?}"),
                Poll::Pending => {}
            }
            // The database is let finish what it was sent before the look.
            settled(admin).await;
            let locked: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
                 AND application_name = $1 AND state = 'idle in transaction' \
                 AND backend_xid IS NOT NULL)",
            )
            .bind(APP)
            .fetch_one(&mut *admin)
            .await
            .expect("activity");
            if locked {
                return write;
            }
            assert!(
                Instant::now() < deadline,
                "no write was ever caught holding the lease row"
            );
        }
    }
}

/// A renewal never waits behind a write of its term: an owner busy
/// writing (here, one write stopped inside its transaction) keeps its
/// shard, which a renewal that queued behind the write would lose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_never_waits_behind_a_write_of_its_term() {
    let (_url, owner, mut admin, fence) = self::owner(TTL).await;
    let write = stopped_write(&owner, &fence, &mut admin).await;
    for _ in 0..3 {
        let asked = Instant::now();
        assert!(
            owner.renew_lease(&fence, TTL).await.expect("renew"),
            "the term was lost while its write was open"
        );
        assert!(
            asked.elapsed() < TTL / 4,
            "a renewal waited {:?} behind a write",
            asked.elapsed()
        );
        tokio::time::sleep(TTL / 3).await;
    }
    let live = owner.lease().await.expect("lease").expect("held");
    assert_eq!(
        (&live.holder, live.epoch, live.live),
        (&fence.holder, fence.epoch, true)
    );
    // Stopped for longer than its term idles, the write was cut off.
    drop(write);
}

/// The lease's time to live in the takeover test: well under the 5 s
/// after which the server ends any connection idle in a transaction.
const TTL: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_stopped_inside_a_write_holds_a_takeover_back_no_longer_than_its_term() {
    let (url, owner, mut admin, fence) = self::owner(TTL).await;
    let next = PgStore::open(&url).await.expect("open");
    let write = stopped_write(&owner, &fence, &mut admin).await;
    let stopped = Instant::now();
    let taken = loop {
        let asked = Instant::now();
        let won = next
            .acquire_lease(&Holder::generate(), TTL)
            .await
            .expect("acquire");
        // A try never waits on the row (a new term that waited would start
        // with less than its time, or none).
        assert!(
            asked.elapsed() < TTL / 4,
            "a try for the lease waited {:?}",
            asked.elapsed()
        );
        if let Some(fence) = won {
            break fence;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "the lease was never taken over"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let waited = stopped.elapsed();
    assert_eq!(taken.epoch, fence.epoch + 1);
    let left: f64 = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM expires_at - clock_timestamp())::float8 FROM leases \
         WHERE name = 'shard:0'",
    )
    .fetch_one(&mut admin)
    .await
    .expect("lease");
    assert!(
        left > TTL.as_secs_f64() / 2.0,
        "the new term starts with {left} s of its {TTL:?}"
    );
    // Out on the database's clock within a term, the lease is taken after
    // at most about one more (the stopped transaction ends after a term
    // idle), well before the 5 s of any idle transaction.
    assert!(
        waited < TTL * 2 + Duration::from_millis(500),
        "the takeover waited {waited:?} for an owner stopped inside a write"
    );
    // Woken, the stopped write commits nothing.
    match write.await {
        Err(SessionError::Storage(_) | SessionError::Fenced { .. }) => {}
        other => panic!("the stopped owner's write passed: {other:?}"),
    }
    let live = next.lease().await.expect("lease").expect("held");
    assert_eq!((live.holder, live.epoch), (taken.holder, taken.epoch));
}
