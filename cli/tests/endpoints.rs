//! The `troupe` binary given several endpoints (replicas of one service): a
//! call goes on from an endpoint it cannot reach to the next, any answer is
//! final, writes carry a request id, and a watch whose server stops resumes
//! on the next endpoint after its last cursor.

use std::{
    path::Path,
    process::{Command, Output, Stdio},
};

use serde_json::Value;
use sqlx::{Connection, sqlite::SqliteConnection};
use troupe_proto::session::TrustLevel;
use troupe_tests::{OPERATOR_TOKEN, TestServer, lines::JsonLines};

const TROUPE: &str = env!("CARGO_BIN_EXE_troupe");

/// The CLI with `endpoints` (as `--endpoint` takes them) and the operator token.
fn troupe(endpoints: &str, data: &Path) -> Command {
    let mut command = Command::new(TROUPE);
    command
        .env("TROUPE_ENDPOINT", endpoints)
        .env("TROUPE_OPERATOR_TOKEN", OPERATOR_TOKEN)
        .env("TROUPE_DATA_DIR", data)
        .env_remove("TROUPE_TOKEN")
        .arg("--json");
    command
}

async fn run(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().expect("troupe runs"))
        .await
        .expect("joined")
}

/// Runs `command` with the words of `line`; returns its exit, JSON output and stderr.
async fn json(mut command: Command, line: &str) -> (bool, Value, String) {
    command.args(line.split_whitespace());
    let output = run(command).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let value = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status.success(), value, format!("{stdout}{stderr}"))
}

/// An endpoint where nothing listens: a port just freed.
async fn dead_endpoint() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    format!("http://{addr}")
}

/// An endpoint whose server is killed while a call waits for its answer:
/// it speaks HTTP/2, takes the call, then drops the connection unanswered.
/// Returns the endpoint and how many calls it took.
async fn dying_endpoint() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::{Arc, atomic::AtomicUsize, atomic::Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let taken = Arc::new(AtomicUsize::new(0));
    let counter = taken.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let (called, on_call) = tokio::sync::mpsc::unbounded_channel::<()>();
                let service = hyper::service::service_fn(move |_request| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let _ = called.send(());
                    std::future::pending::<
                        Result<
                            hyper::Response<http_body_util::Empty<bytes::Bytes>>,
                            std::convert::Infallible,
                        >,
                    >()
                });
                let connection =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                let mut on_call = on_call;
                // Dropping the connection closes its socket, the call unanswered.
                tokio::select! {
                    _ = connection => {}
                    _ = on_call.recv() => {}
                }
            });
        }
    });
    (format!("http://{addr}"), taken)
}

/// Counts the request ids a server's SQLite database recorded (the server stopped).
async fn request_ids(server: &TestServer) -> i64 {
    let mut db = SqliteConnection::connect(&server.config.database_url())
        .await
        .expect("open the database");
    let (count,): (i64,) = sqlx::query_as("SELECT count(*) FROM idempotency")
        .fetch_one(&mut db)
        .await
        .expect("count");
    count
}

/// With a dead endpoint first, every call is answered by the live one; the
/// create and the send carry request ids of their own (so that a repeat on
/// another replica is a replay), and each is done once.
#[tokio::test(flavor = "multi_thread")]
async fn calls_go_on_from_a_dead_endpoint_to_a_live_one() {
    let mut server = TestServer::start().await;
    let data = tempfile::tempdir().expect("dir");
    let endpoints = format!("{},http://{}", dead_endpoint().await, server.addr);

    let (ok, created, out) = json(
        troupe(&endpoints, data.path()),
        "session create --workspace alpha --agent worker --title lead --message start",
    )
    .await;
    assert!(ok, "{out}");
    let id = created["session"]["session_id"].as_str().expect("an id");
    let (ok, _, out) = json(
        troupe(&endpoints, data.path()),
        &format!("session send {id} --message hello"),
    )
    .await;
    assert!(ok, "{out}");
    let (ok, listed, out) = json(
        troupe(&endpoints, data.path()),
        "session list --workspace alpha",
    )
    .await;
    assert!(ok, "{out}");
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    let (ok, got, out) = json(
        troupe(&endpoints, data.path()),
        &format!("session get {id}"),
    )
    .await;
    assert!(ok, "{out}");
    assert_eq!(got["inbox_count"], 2, "the initial message and one send");

    server.stop_for_restart().await;
    assert_eq!(request_ids(&server).await, 2, "the create's and the send's");
}

/// A replica killed while a call waits for its answer is an endpoint that
/// cannot be reached, not an answer: the call goes on to the next one.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_whose_server_dies_midway_goes_on_to_the_next_endpoint() {
    let server = TestServer::start().await;
    let data = tempfile::tempdir().expect("dir");
    let (dying, taken) = dying_endpoint().await;
    let endpoints = format!("{dying},http://{}", server.addr);
    let (ok, created, out) = json(
        troupe(&endpoints, data.path()),
        "session create --workspace alpha --agent worker --title lead --message start",
    )
    .await;
    assert!(ok, "{out}");
    let id = created["session"]["session_id"].as_str().expect("an id");
    let (ok, got, out) = json(
        troupe(&endpoints, data.path()),
        &format!("session get {id}"),
    )
    .await;
    assert!(ok, "{out}");
    assert_eq!(got["session"]["session_id"], id);
    assert_eq!(
        taken.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "each call reached the dying endpoint first"
    );
}

/// With no other endpoint, a call whose server dies midway fails, said
/// with a failing exit: never taken for stdout closing.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_whose_only_server_dies_midway_fails_and_says_so() {
    let data = tempfile::tempdir().expect("dir");
    let (dying, taken) = dying_endpoint().await;
    let output = run({
        let mut command = troupe(&dying, data.path());
        command.args(["session", "list", "--workspace", "alpha"]);
        command
    })
    .await;
    // With `--json`, the failure is a JSON error on stdout.
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        !output.status.success(),
        "exit 0 for a failed call: {stdout}"
    );
    let said: Value = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    assert!(
        said["error"]["message"].is_string(),
        "nothing said of the failure: {stdout}"
    );
    assert_eq!(
        taken.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "a lone endpoint is tried again once"
    );
}

/// A refusal is an answer: it is not tried on the next endpoint.
#[tokio::test(flavor = "multi_thread")]
async fn a_refusal_is_final_and_not_tried_elsewhere() {
    let first = TestServer::start().await;
    let second = TestServer::start().await;
    let data = tempfile::tempdir().expect("dir");
    let (session, _, _) = second.root("alpha", TrustLevel::Direct).await;
    let endpoints = format!("http://{},http://{}", first.addr, second.addr);
    let (ok, error, out) = json(
        troupe(&endpoints, data.path()),
        &format!("session get {}", session.session_id),
    )
    .await;
    assert!(!ok, "the first endpoint's answer stands: {out}");
    assert_eq!(error["error"]["reason"], "SESSION_NOT_FOUND", "{out}");
}

/// With every endpoint dead, the failure names each.
#[tokio::test(flavor = "multi_thread")]
async fn with_no_endpoint_reachable_the_error_names_each() {
    let data = tempfile::tempdir().expect("dir");
    let (one, two) = (dead_endpoint().await, dead_endpoint().await);
    let (ok, error, out) = json(
        troupe(&format!("{one},{two}"), data.path()),
        "session list --workspace alpha",
    )
    .await;
    assert!(!ok, "{out}");
    assert_eq!(error["error"]["code"], "UNAVAILABLE", "{out}");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(&one) && message.contains(&two), "{out}");
}

/// A watch whose server stops is opened again on the next endpoint, after
/// the last cursor it printed. (Two SQLite servers hold different events:
/// the second's events up to that cursor are not printed, those after are,
/// in order; on one PostgreSQL database they would be the same events.)
#[tokio::test(flavor = "multi_thread")]
async fn a_watch_moves_on_to_the_next_endpoint_after_its_cursor() {
    let first = TestServer::start().await;
    let second = TestServer::start().await;
    let data = tempfile::tempdir().expect("dir");
    // The first holds 2 events (created, message), the second 8.
    let (on_first, _, _) = first.root("alpha", TrustLevel::Direct).await;
    let mut on_second = Vec::new();
    for _ in 0..4 {
        on_second.push(second.root("alpha", TrustLevel::Direct).await.0.session_id);
    }
    let mut watch = troupe(
        &format!("http://{},http://{}", first.addr, second.addr),
        data.path(),
    )
    .args(["session", "watch"])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("watch runs");
    let mut lines = JsonLines::read(watch.stdout.take().expect("stdout"));
    let mut seen = Vec::new();
    for _ in 0..2 {
        seen.push(lines.next().await);
    }
    assert!(
        seen.iter()
            .all(|e| e["session_id"] == on_first.session_id.as_str()),
        "the first endpoint's events: {seen:?}"
    );

    first.stop().await;
    // Cursors 3 to 8 of the second: its last three sessions' events.
    for _ in 0..6 {
        seen.push(lines.next().await);
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let cursors: Vec<i64> = seen
        .iter()
        .filter_map(|e| e["cursor"].as_str())
        .map(|c| troupe_tests::position(c, "alpha"))
        .collect();
    assert_eq!(cursors, [1, 2, 3, 4, 5, 6, 7, 8], "{seen:?}");
    let moved: Vec<&str> = seen[2..]
        .iter()
        .filter_map(|e| e["session_id"].as_str())
        .collect();
    assert!(
        moved
            .iter()
            .all(|id| on_second[1..].contains(&id.to_string())),
        "the second endpoint's events after cursor 2: {moved:?}"
    );
    second.stop().await;
}
