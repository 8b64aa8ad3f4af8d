//! Several `troupe-session` processes with `--runner` on one PostgreSQL
//! database, as the takeover tests start them, and what those tests read
//! back: a session's output from the database, its status, who holds its
//! shard.
//!
//! A replica alone takes every shard; once a second one joins, the first
//! gives up its highest half. So a session in a workspace of the low half
//! ([`low_workspace`]) created after [`balanced`] is the first replica's.

use std::{path::Path, path::PathBuf, time::Duration};

use base64::Engine as _;
use sqlx::{Connection, PgConnection};
use troupe_proto::session::SessionStatus;
use troupe_session_svc::{
    cursor::Cursor,
    model::{EventFilter, EventKind},
    shard::{SHARDS, Shard},
    store::{EventPage, Lease, PgStore, prelude::*},
};
use troupe_tests::process::SessionProcess;

use super::{MINUTE, test_agent};

/// Lines the root agent prints, one every 20 ms, before it echoes its stdin.
pub const LINES: usize = 250;

/// The replicas' `--lease-ttl-ms`.
pub const LEASE_TTL: Duration = Duration::from_millis(1000);

pub fn binary() -> String {
    let exe = std::env::current_exe().unwrap();
    let path: PathBuf = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("troupe-session");
    assert!(
        path.exists(),
        "build the service first: cargo build -p troupe-session-svc ({})",
        path.display()
    );
    path.display().to_string()
}

/// A replica on `url` driving `runner`, with agents `printer`, `brief` and
/// `echo` (`cat`: each stdin line back as it comes).
pub fn replica(url: &str, runner: &str) -> SessionProcess {
    replica_logging(url, runner, None)
}

/// [`replica`], its log written to `log` if given.
pub fn replica_logging(url: &str, runner: &str, log: Option<&Path>) -> SessionProcess {
    replica_for(url, runner, log, LEASE_TTL)
}

/// [`replica`] whose leases last `ttl` (renewed every 200 ms).
pub fn replica_for(url: &str, runner: &str, log: Option<&Path>, ttl: Duration) -> SessionProcess {
    let printer =
        format!("i=0; while [ $i -lt {LINES} ]; do i=$((i+1)); echo line$i; sleep 0.02; done; cat");
    let agents = [
        ("printer", printer.as_str()),
        ("brief", "sleep 3; echo done"),
        ("echo", "cat"),
    ];
    start_replica_for(url, Some(runner), &agents, log, ttl)
}

/// A replica on `url`, driving `runner` if given (else the runners that
/// register with it), with each `(name, sh -c script)` of `agents`.
pub fn start_replica(
    url: &str,
    runner: Option<&str>,
    agents: &[(&str, &str)],
    log: Option<&Path>,
) -> SessionProcess {
    start_replica_for(url, runner, agents, log, LEASE_TTL)
}

/// [`start_replica`] whose leases last `ttl`.
fn start_replica_for(
    url: &str,
    runner: Option<&str>,
    agents: &[(&str, &str)],
    log: Option<&Path>,
    ttl: Duration,
) -> SessionProcess {
    let dir = tempfile::tempdir().unwrap();
    let agents_dir = dir.path().join("data/agents");
    std::fs::create_dir_all(&agents_dir).unwrap();
    for (name, script) in agents {
        std::fs::write(
            agents_dir.join(format!("{name}.md")),
            test_agent(name, &["sh", "-c", script]),
        )
        .unwrap();
    }
    let ttl = ttl.as_millis().to_string();
    let mut flags = vec!["--database-url", url];
    if let Some(runner) = runner {
        flags.extend(["--runner", runner]);
    }
    flags.extend(["--lease-ttl-ms", &ttl, "--lease-renew-ms", "200"]);
    SessionProcess::start_logging(&binary(), dir, &flags, &[], log)
}

/// A workspace of `runner`'s in the low half of the shards, which the
/// first replica keeps when a second joins.
pub fn low_workspace(runner: &super::TestRunner, name: &str) -> String {
    loop {
        let workspace = runner.workspace(name);
        if Shard::of(&workspace).index() < SHARDS / 2 {
            return workspace;
        }
    }
}

/// Waits (a minute at most) until `replicas` replicas each hold their
/// share of the shards, every shard held.
pub async fn balanced(store: &PgStore, replicas: usize) {
    let share = usize::from(SHARDS).div_ceil(replicas);
    until("the replicas never divided the shards", MINUTE, || async {
        let leases = store.shard_leases().await.unwrap();
        let mut holders: std::collections::HashMap<String, usize> = Default::default();
        for lease in leases.iter().filter(|l| l.live) {
            *holders.entry(lease.holder.to_string()).or_default() += 1;
        }
        (holders.len() == replicas
            && holders.values().all(|&n| n + 1 >= share && n <= share)
            && holders.values().sum::<usize>() == usize::from(SHARDS))
        .then_some(())
    })
    .await
}

/// The live lease of `workspace`'s shard, once a replica took it (within
/// a minute).
pub async fn shard_lease(store: &PgStore, workspace: &str) -> Lease {
    let shard = Shard::of(workspace);
    until("nobody took the shard", MINUTE, || async {
        let leases = store.shard_leases().await.unwrap();
        leases.into_iter().find(|l| l.shard == shard && l.live)
    })
    .await
}

/// The live lease of `held`'s shard in a later term, once another replica
/// took over (within `limit`).
pub async fn taken_over(store: &PgStore, held: &Lease, limit: Duration) -> Lease {
    until("nobody took over", limit, || async {
        let leases = store.shard_leases().await.unwrap();
        leases
            .into_iter()
            .find(|l| l.shard == held.shard && l.live && l.epoch > held.epoch)
    })
    .await
}

/// Kills the replica (SIGKILL) and waits until it is gone.
pub async fn kill_replica(replica: &mut SessionProcess) {
    replica.kill();
    assert!(
        replica
            .exited_within(Duration::from_secs(10))
            .await
            .is_some(),
        "the owner outlived SIGKILL"
    );
}

/// A transaction on `url` that holds locks until it is released: a
/// replica's write that needs them waits meanwhile.
pub struct Holder(PgConnection);

impl Holder {
    /// Begins, and locks the rows `query` selects (`$1` bound to `id`).
    pub async fn rows(url: &str, query: &'static str, id: &str) -> Holder {
        let mut holder = PgConnection::connect(url).await.unwrap();
        sqlx::raw_sql("BEGIN").execute(&mut holder).await.unwrap();
        sqlx::query(query)
            .bind(id)
            .fetch_all(&mut holder)
            .await
            .unwrap();
        Holder(holder)
    }

    /// Begins, and runs `lock` (a `LOCK TABLE` statement).
    pub async fn table(url: &str, lock: &'static str) -> Holder {
        let mut holder = PgConnection::connect(url).await.unwrap();
        sqlx::raw_sql("BEGIN").execute(&mut holder).await.unwrap();
        sqlx::raw_sql(lock).execute(&mut holder).await.unwrap();
        Holder(holder)
    }

    /// Rolls back: the waiting writes go on.
    pub async fn release(mut self) {
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut self.0)
            .await
            .unwrap();
    }
}

/// Waits until a statement on `url`'s database waits on a lock, one whose
/// query is `LIKE` `query` (within a minute; `what` says what did not).
pub async fn until_lock_wait(url: &str, query: &str, what: &str) {
    let watcher = sqlx::PgPool::connect(url).await.unwrap();
    until(what, MINUTE, || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND query LIKE $1",
        )
        .bind(query)
        .fetch_one(&watcher)
        .await
        .unwrap();
        (waiting > 0).then_some(())
    })
    .await;
}

/// The session's output, once it holds `needle` (within a minute; `what`
/// says what did not come).
pub async fn output_with(store: &PgStore, id: &str, needle: &str, what: &str) -> String {
    until(what, MINUTE, || async {
        let out = output(store, id).await;
        out.contains(needle).then_some(out)
    })
    .await
}

/// Sends `text` to the session through `client`, then waits until its
/// output holds it (within a minute; `what` says what did not come);
/// returns the output.
pub async fn send_until_echoed(
    client: &mut troupe_tests::Client,
    store: &PgStore,
    id: &str,
    text: &str,
    what: &str,
) -> String {
    client
        .send_message(troupe_tests::message(id, text))
        .await
        .unwrap();
    output_with(store, id, text, what).await
}

/// Terminates the session through `client`, then stops `replica`, which
/// must exit cleanly.
pub async fn end_and_stop(client: &mut troupe_tests::Client, id: &str, replica: SessionProcess) {
    client
        .terminate_session(troupe_tests::terminate(id))
        .await
        .unwrap();
    assert!(replica.stop().await);
}

/// Waits until the store records at least `seq` of the session's messages
/// delivered (within a minute).
pub async fn until_delivered(store: &PgStore, id: &str, seq: u64) {
    until("the delivery was never recorded", MINUTE, || async {
        let process = store.process(&id.into()).await.unwrap()?;
        (process.delivered_seq >= seq).then_some(())
    })
    .await
}

/// Waits until the session runs, as `client` reads it (within a minute).
pub async fn until_running(client: &troupe_tests::Client, id: &str) {
    until("the session never ran", MINUTE, || {
        let mut client = client.clone();
        async move { (status(&mut client, id).await == SessionStatus::Running).then_some(()) }
    })
    .await
}

/// Asserts that each of the [`LINES`] lines the printer prints is in `out`
/// once.
pub fn assert_each_line_once(out: &str) {
    for n in 1..=LINES {
        let line = format!("line{n}");
        assert_eq!(
            out.lines().filter(|l| *l == line).count(),
            1,
            "{line} once in {out}"
        );
    }
}

pub async fn until<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    limit: Duration,
    mut probe: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every output byte of a session's output events, in order.
pub async fn output(store: &PgStore, id: &str) -> String {
    let filter = EventFilter {
        session_id: Some(id.into()),
        ..EventFilter::default()
    };
    let mut cursor = Cursor::default();
    let mut out = Vec::new();
    loop {
        let EventPage::Events(events) = store.events_after(&filter, &cursor, 500).await.unwrap()
        else {
            panic!("pruned");
        };
        if events.is_empty() {
            return String::from_utf8_lossy(&out).into_owned();
        }
        for e in events {
            cursor.advance(e.shard, e.position);
            if e.kind == EventKind::Output {
                let detail: serde_json::Value = serde_json::from_str(&e.detail).unwrap();
                out.extend(
                    base64::engine::general_purpose::STANDARD
                        .decode(detail["data"].as_str().unwrap())
                        .unwrap(),
                );
            }
        }
    }
}

pub async fn status(client: &mut troupe_tests::Client, id: &str) -> SessionStatus {
    client
        .get_session(troupe_tests::get(id))
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap()
        .status()
}
