//! `troupe runner list` against a real session service: registered runners
//! as a table and as JSON, a lapsed one shown lapsed, and a session's token
//! refused (the fleet is the operator's); `troupe replica list`, the
//! replicas and the shards each holds.

use std::process::{Command, Output};

use serde_json::Value;
use troupe_proto::fleet::{RegisterRunnerRequest, fleet_service_client::FleetServiceClient};
use troupe_proto::session::TrustLevel;
use troupe_tests::{Bearer, OPERATOR_TOKEN, TestServer};

const TROUPE: &str = env!("CARGO_BIN_EXE_troupe");

async fn troupe(server: &TestServer, token: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(TROUPE);
    command
        .env("TROUPE_ENDPOINT", format!("http://{}", server.addr))
        .env("TROUPE_OPERATOR_TOKEN", OPERATOR_TOKEN)
        .env("TROUPE_DATA_DIR", "/nonexistent")
        .env_remove("TROUPE_TOKEN")
        .args(args);
    if let Some(token) = token {
        command.env("TROUPE_TOKEN", token);
    }
    tokio::task::spawn_blocking(move || command.output().expect("troupe runs"))
        .await
        .expect("joined")
}

async fn register(server: &TestServer, name: &str, capacity: u32, lease_ttl_ms: u32) {
    let channel = troupe_proto::endpoint::connect(&format!("http://{}", server.addr))
        .await
        .expect("connect");
    let mut client =
        FleetServiceClient::with_interceptor(channel, Bearer::new(Some(OPERATOR_TOKEN)).unwrap());
    client
        .register_runner(RegisterRunnerRequest {
            name: name.to_owned(),
            endpoint: format!("http://{name}.internal:7401"),
            capacity,
            lease_ttl_ms,
        })
        .await
        .expect("registered");
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "troupe failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).expect("UTF-8")
}

#[tokio::test(flavor = "multi_thread")]
async fn runners_are_listed_as_a_table_and_as_json() {
    let server = TestServer::start().await;
    register(&server, "host-b", 3, 500).await;
    register(&server, "host-a", 8, 60_000).await;

    let table = stdout(&troupe(&server, None, &["runner", "list"]).await);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("NAME"), "{table}");
    let a = lines
        .iter()
        .position(|l| l.starts_with("host-a"))
        .expect(&table);
    let b = lines
        .iter()
        .position(|l| l.starts_with("host-b"))
        .expect(&table);
    assert!(a < b, "listed by name:\n{table}");
    let columns: Vec<&str> = lines[a].split_whitespace().collect();
    assert_eq!(
        columns,
        [
            "host-a",
            "live",
            "0",
            "8",
            "8",
            "http://host-a.internal:7401"
        ],
        "{table}"
    );

    // host-b's lease (500 ms) lapses: the JSON form says so.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let json: Value = serde_json::from_str(&stdout(
            &troupe(&server, None, &["runner", "list", "--json"]).await,
        ))
        .expect("JSON");
        let b = json
            .as_array()
            .expect("an array")
            .iter()
            .find(|r| r["name"] == "host-b")
            .cloned()
            .expect("host-b listed");
        assert_eq!(b["capacity"], 3);
        assert_eq!(b["room"], 3);
        assert_eq!(b["embedded"], false);
        if b["live"] == false {
            let text = stdout(&troupe(&server, None, &["runner", "list"]).await);
            let line = text.lines().find(|l| l.starts_with("host-b")).expect(&text);
            assert!(line.contains(" lapsed "), "{text}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "host-b never lapsed: {b}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sessions_token_may_not_list_runners() {
    let server = TestServer::start().await;
    let (_, _, token) = server.root("ws", TrustLevel::Direct).await;
    let output = troupe(&server, Some(&token), &["runner", "list"]).await;
    assert!(!output.status.success(), "an agent listed the runners");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("OPERATOR_ONLY"), "{stderr}");
    assert!(output.stdout.is_empty(), "printed {:?}", output.stdout);
}

/// `troupe replica list`: a SQLite service alone holds every shard, each
/// in a term of its own.
#[tokio::test(flavor = "multi_thread")]
async fn the_replicas_and_their_shards_are_listed() {
    let server = TestServer::start().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let json = loop {
        let json: Value = serde_json::from_str(&stdout(
            &troupe(&server, None, &["replica", "list", "--json"]).await,
        ))
        .expect("JSON");
        if json["unheld"].as_array().is_some_and(Vec::is_empty) {
            break json;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "shards unheld: {json}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(json["shard_count"], 64);
    let replicas = json["replicas"].as_array().expect("replicas");
    assert_eq!(replicas.len(), 1, "{json}");
    let shards = replicas[0]["shards"].as_array().expect("shards");
    let numbers: Vec<u64> = shards
        .iter()
        .map(|t| t["shard"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, (0..64).collect::<Vec<u64>>());
    assert!(
        shards.iter().all(|t| t["epoch"].as_u64() >= Some(1)),
        "{json}"
    );
    let holder = replicas[0]["holder"].as_str().expect("holder");
    assert!(holder.starts_with("svc_"), "{holder}");

    let table = stdout(&troupe(&server, None, &["replica", "list"]).await);
    let line = table.lines().find(|l| l.starts_with(holder)).expect(&table);
    let columns: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(columns, [holder, "live", "64", "0-63"], "{table}");
    assert!(!table.contains("unheld"), "{table}");

    let (_, _, token) = server.root("ws", TrustLevel::Direct).await;
    let output = troupe(&server, Some(&token), &["replica", "list"]).await;
    assert!(!output.status.success(), "an agent listed the replicas");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("OPERATOR_ONLY"), "{stderr}");
}
