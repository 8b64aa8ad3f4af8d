//! A broadcast flood: 20 sessions of one workspace of 64 each broadcast to
//! the other 63 as fast as the service lets them for 20 s, and the database
//! grows by what it stored. Run on the service's default message limits,
//! then with its byte bounds off (no byte rate, no inbox bound): what the
//! bounds save.
//!
//! Each sender sends the largest body its limits let through at once (with
//! the byte bounds on, the byte burst shared by 63 recipients; off, the
//! largest message, 256 KiB), of printable bytes no compression shrinks
//! much, and, refused RATE_LIMITED, waits what the refusal says. Prints per run: the broadcasts and messages (recipients)
//! stored, the bytes the agents would read (body × recipients), and the
//! database's growth (SQLite: the database file and its WAL; PostgreSQL:
//! `pg_database_size`).
//!
//! Run: `cargo bench -p troupe-tests --bench message_flood` (SQLite), and
//! with `TROUPE_TEST_BACKEND=postgres TROUPE_TEST_POSTGRES_URL=...`.

use std::time::{Duration, Instant};

use troupe_proto::session::{self as pb, TrustLevel};
use troupe_session_svc::MessageLimits;
use troupe_tests::{Client, TestServer, error_metadata, postgres, reason};

const SESSIONS: usize = 64;
const SENDERS: usize = 20;
const FLOOD: Duration = Duration::from_secs(20);
const LARGEST: usize = 256 * 1024;

/// What one sender got stored.
#[derive(Default)]
struct Sent {
    broadcasts: u64,
    messages: u64,
    bytes: u64,
    refusals: u64,
}

async fn flood(mut client: Client, body: String, until: Instant) -> Sent {
    let mut sent = Sent::default();
    while Instant::now() < until {
        let answer = client
            .broadcast(pb::BroadcastRequest {
                message: body.clone(),
                scope: pb::BroadcastScope::Workspace as i32,
                request_id: String::new(),
                workspace_id: String::new(),
            })
            .await;
        match answer {
            Ok(answer) => {
                let delivered = answer
                    .into_inner()
                    .recipients
                    .iter()
                    .filter(|r| r.outcome() == pb::RecipientOutcome::Delivered)
                    .count() as u64;
                sent.broadcasts += 1;
                sent.messages += delivered;
                sent.bytes += delivered * body.len() as u64;
            }
            Err(status) if reason(&status) == "RATE_LIMITED" => {
                sent.refusals += 1;
                let wait = error_metadata(&status, "retry_after_ms")
                    .and_then(|ms| ms.parse().ok())
                    .unwrap_or(100);
                tokio::time::sleep(Duration::from_millis(wait).max(Duration::from_millis(10)))
                    .await;
            }
            Err(status) => panic!("broadcast: {status:?}"),
        }
    }
    sent
}

/// `len` letters that no compression shrinks much (PostgreSQL compresses
/// long values): a hostile sender's body, not a run of one byte.
fn incompressible(len: usize) -> String {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(b'!' + (state % 94) as u8)
        })
        .collect()
}

/// The database's size in bytes.
async fn database_bytes(server: &TestServer) -> u64 {
    let url = server.config.database_url();
    if postgres::is_postgres(&url) {
        server
            .stored_number("SELECT pg_database_size(current_database())")
            .await as u64
    } else {
        ["troupe.db", "troupe.db-wal"]
            .iter()
            .filter_map(|f| std::fs::metadata(server.config.data_dir.join(f)).ok())
            .map(|m| m.len())
            .sum()
    }
}

async fn run(name: &str, limits: MessageLimits) {
    let server = TestServer::start_with(|c| {
        c.messaging = limits;
        c.limits.max_active_per_workspace = SESSIONS as u32 + 1;
    })
    .await;
    let mut senders = Vec::new();
    for n in 0..SESSIONS {
        let (_, client, _) = server.root("flood", TrustLevel::Sandboxed).await;
        if n < SENDERS {
            senders.push(client);
        }
    }
    let body_len = if limits.message_bytes_per_sec == 0 {
        LARGEST
    } else {
        (limits.message_bytes_burst as usize / (SESSIONS - 1)).min(LARGEST)
    };
    let body = incompressible(body_len);
    let before = database_bytes(&server).await;
    let until = Instant::now() + FLOOD;
    let floods: Vec<_> = senders
        .into_iter()
        .map(|c| tokio::spawn(flood(c, body.clone(), until)))
        .collect();
    let mut all = Sent::default();
    for f in floods {
        let sent = f.await.expect("a sender");
        all.broadcasts += sent.broadcasts;
        all.messages += sent.messages;
        all.bytes += sent.bytes;
        all.refusals += sent.refusals;
    }
    let after = database_bytes(&server).await;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "{name}: body {body_len} B; {} broadcasts, {} messages, {:.1} MiB to read, {} refusals; \
         database {:.1} -> {:.1} MiB (+{:.1})",
        all.broadcasts,
        all.messages,
        mib(all.bytes),
        all.refusals,
        mib(before),
        mib(after),
        mib(after.saturating_sub(before)),
    );
    server.stop().await;
}

#[tokio::main]
async fn main() {
    let backend = postgres::Backend::from_env();
    println!(
        "{SENDERS} senders of {SESSIONS} sessions, {} s, on {backend:?}",
        FLOOD.as_secs()
    );
    run("defaults", MessageLimits::default()).await;
    run(
        "byte bounds off",
        MessageLimits {
            message_bytes_per_sec: 0,
            max_unread_bytes: u64::MAX / 2,
            ..MessageLimits::default()
        },
    )
    .await;
}
