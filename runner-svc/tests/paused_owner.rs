//! The owner of a session's shard paused (SIGSTOP) past its lease while
//! the agent prints, on PostgreSQL with a real runner (run under
//! `scripts/pg-env`; the binary comes from `cargo build -p
//! troupe-session-svc`): another replica takes over, and once the paused
//! one wakes (SIGCONT) it writes nothing more of its old terms, makes no
//! runner call that shows, stops their work, and takes back only the share
//! the other gives up, never the session's shard while its owner lives.
//!
//! Who wrote what is read from the database itself: each replica connects
//! with its own `application_name`, and a trigger the test installs on
//! every table of the service records each row written, by whom, when
//! (the database's clock) and, for a process row, its runner sequence
//! before and after.

use crate::common;

use std::time::Duration;

use common::{
    MINUTE, TestRunner, direct_root,
    replicas::{
        LINES, assert_each_line_once, balanced, end_and_stop, low_workspace, output, output_with,
        replica_logging, shard_lease, taken_over, until,
    },
};
use sqlx::{Connection, PgConnection};
use troupe_session_svc::{shard::Shard, store::PgStore};

/// The written-rows record and its trigger, on every table of the service.
const RECORD_WRITES: &str = r#"
CREATE TABLE written (
    id        BIGSERIAL PRIMARY KEY,
    app       TEXT NOT NULL,
    tbl       TEXT NOT NULL,
    op        TEXT NOT NULL,
    at        TIMESTAMPTZ NOT NULL,
    old_seq   BIGINT,
    new_seq   BIGINT,
    name      TEXT
);
CREATE FUNCTION record_write() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE old_seq BIGINT; new_seq BIGINT; name TEXT;
BEGIN
    IF TG_TABLE_NAME = 'processes' THEN
        IF TG_OP <> 'INSERT' THEN old_seq := OLD.runner_seq; END IF;
        IF TG_OP <> 'DELETE' THEN new_seq := NEW.runner_seq; END IF;
    END IF;
    IF TG_TABLE_NAME = 'leases' AND TG_OP <> 'DELETE' THEN name := NEW.name; END IF;
    INSERT INTO written (app, tbl, op, at, old_seq, new_seq, name) VALUES (
        current_setting('application_name'), TG_TABLE_NAME, TG_OP, clock_timestamp(),
        old_seq, new_seq, name);
    RETURN NULL;
END $$;
DO $$
DECLARE t TEXT;
BEGIN
    FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = 'public'
             AND tablename NOT IN ('written', '_sqlx_migrations') LOOP
        EXECUTE format('CREATE TRIGGER record_write AFTER INSERT OR UPDATE OR DELETE ON %I '
                        'FOR EACH ROW EXECUTE FUNCTION record_write()', t);
    END LOOP;
END $$;
"#;

/// `url` with the connections' `application_name`.
fn named(url: &str, name: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}application_name={name}")
}

async fn send(client: &mut troupe_tests::Client, to: &str, text: &str) {
    client
        .send_message(troupe_tests::message(to, text))
        .await
        .expect("send");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_writes_nothing_once_it_wakes() {
    let url = troupe_tests::postgres::fresh_database().await;
    let runner = TestRunner::driven().await;
    let endpoint = format!("http://{}", runner.addr);
    let store = PgStore::open(&url).await.unwrap();
    let mut db = PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql(RECORD_WRITES).execute(&mut db).await.unwrap();

    let logs = tempfile::tempdir().unwrap();
    let first_log = logs.path().join("first.log");
    let first = replica_logging(&named(&url, "first"), &endpoint, Some(&first_log));
    balanced(&store, 1).await;
    let second = replica_logging(&named(&url, "second"), &endpoint, None);
    balanced(&store, 2).await;
    let workspace = low_workspace(&runner, "paused");
    let held = shard_lease(&store, &workspace).await;
    assert_eq!(held.holder.pid(), Some(first.pid()), "the first keeps it");
    let mut via_second = second.operator().await;
    let root = direct_root(&mut via_second, &workspace, "printer", "first")
        .await
        .session_id;
    output_with(&store, &root, "line20\n", "the root never printed").await;

    // Paused mid-output, past its lease: the other takes over and delivers
    // a message sent meanwhile. Paused inside a write, the owner holds the
    // lease row until the server ends its transaction, idle for a term
    // (1 s here), well before the 5 s after which it ends any idle one.
    first.signal("STOP");
    let taken = taken_over(&store, &held, Duration::from_secs(4)).await;
    assert_ne!(taken.holder, held.holder);
    send(&mut via_second, &root, "while paused").await;
    // Delivered (the agent echoes its stdin only once it has printed).
    until("the new owner never delivered", MINUTE, || {
        let url = url.clone();
        let root = root.clone();
        async move {
            let mut db = PgConnection::connect(&url).await.unwrap();
            let seq: i64 =
                sqlx::query_scalar("SELECT delivered_seq FROM processes WHERE session_id = $1")
                    .bind(&root)
                    .fetch_one(&mut db)
                    .await
                    .unwrap();
            (seq >= 2).then_some(())
        }
    })
    .await;
    let printed_before_wake = output(&store, &root).await.matches("line").count();
    assert!(
        printed_before_wake < LINES,
        "the agent still prints when the owner wakes"
    );
    first.signal("CONT");
    send(&mut via_second, &root, "after the wake").await;

    let deadline = tokio::time::Instant::now() + MINUTE;
    loop {
        let log = std::fs::read_to_string(&first_log).unwrap_or_default();
        if log.contains("shard lost: its background work stops here") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the woken owner never stopped its work: {log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = until("the root's output never completed", MINUTE, || async {
        let out = output(&store, &root).await;
        (out.contains(&format!("line{LINES}\n")) && out.contains("after the wake")).then_some(out)
    })
    .await;
    // Each line printed, and each message written to stdin, once.
    assert_each_line_once(&out);
    for message in ["\"first\"", "while paused", "after the wake"] {
        assert_eq!(out.matches(message).count(), 1, "{message} once in {out}");
    }
    // The session's shard stays with the new owner: the woken one takes
    // back only the half the other gives up (the high shards).
    balanced(&store, 2).await;
    let lease = shard_lease(&store, &workspace).await;
    assert_eq!((lease.holder, lease.epoch), (taken.holder, taken.epoch));

    // Nothing the woken replica wrote after the takeover, and no runner
    // sequence ever went back.
    let takeover: (String, String) = sqlx::query_as(
        "SELECT app, at::text FROM written WHERE tbl = 'leases' AND app = 'second' \
         AND name = $1 ORDER BY id LIMIT 1",
    )
    .bind(Shard::of(&workspace).lease_name())
    .fetch_one(&mut db)
    .await
    .unwrap();
    // Its own rows aside (its leases, the replicas' row), which it takes
    // anew once back.
    let stale: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT tbl, op, at::text FROM written WHERE app = 'first' \
         AND tbl NOT IN ('leases', 'replicas') \
         AND at > (SELECT MIN(at) FROM written WHERE tbl = 'leases' AND app = 'second' \
                   AND name = $1)",
    )
    .bind(Shard::of(&workspace).lease_name())
    .fetch_all(&mut db)
    .await
    .unwrap();
    assert!(
        stale.is_empty(),
        "the paused owner wrote after the takeover at {}: {stale:?}",
        takeover.1
    );
    let backwards: Vec<(i64, i64, String)> = sqlx::query_as(
        "SELECT old_seq, new_seq, app FROM written WHERE tbl = 'processes' \
         AND op = 'UPDATE' AND new_seq < old_seq",
    )
    .fetch_all(&mut db)
    .await
    .unwrap();
    assert!(backwards.is_empty(), "runner_seq went back: {backwards:?}");
    let by_new_owner: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM written WHERE app = 'second' AND tbl = 'events'")
            .fetch_one(&mut db)
            .await
            .unwrap();
    assert!(by_new_owner > 0, "the record shows the new owner's writes");

    end_and_stop(&mut via_second, &root, second).await;
    assert!(first.stop().await, "the woken replica stops cleanly");
}
