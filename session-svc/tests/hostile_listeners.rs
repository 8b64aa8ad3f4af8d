//! Floods of slow connections against a session service started under a
//! low open-file limit (512: what 20,000 connections do to the default
//! limit, a thousand do here). Each listener holds its share of the
//! descriptors and no more: a console flooded with half-sent request heads
//! and an agent (another uid) holding connections open on the agents'
//! socket leave the gRPC port answering, the database working and the
//! other agents' connections admitted; the refusals are counted in the
//! metrics and logged; the stalled heads are cut after the header timeout.

use std::{
    io::Write as _,
    os::unix::fs::PermissionsExt,
    path::Path,
    time::{Duration, Instant},
};

use tokio::{io::AsyncWriteExt, net::TcpStream};
use troupe_proto::session::ListWorkspaceSessionsRequest;
use troupe_tests::{floods, ports, process::SessionProcess};

/// The open-file limit the service runs under (soft and hard).
const LIMIT: u32 = 512;
/// Connections each flood opens: more than the whole limit.
const FLOOD: usize = 700;
/// The uid of the hostile agent (any uid but the test's).
const AGENT_UID: u32 = 23_456;

/// A script that runs the service under [`LIMIT`] open files.
fn limited(dir: &Path) -> String {
    let path = dir.join("limited.sh");
    let mut file = std::fs::File::create(&path).unwrap();
    writeln!(
        file,
        "#!/bin/sh\nulimit -n {LIMIT}\nexec {} \"$@\"",
        env!("CARGO_BIN_EXE_troupe-session")
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// A process of another uid that holds [`FLOOD`] connections to the
/// agents' socket open, silent, until killed; prints how many it opened.
fn flood_socket(socket: &Path) -> tokio::process::Child {
    let script = format!(
        "import os, socket, sys, time\n\
         os.setgid({AGENT_UID}); os.setuid({AGENT_UID})\n\
         held = []\n\
         for _ in range({FLOOD}):\n\
         \x20   s = socket.socket(socket.AF_UNIX)\n\
         \x20   try:\n\
         \x20       s.connect({socket:?}); held.append(s)\n\
         \x20   except OSError:\n\
         \x20       break\n\
         print(len(held), flush=True)\n\
         time.sleep(600)\n"
    );
    tokio::process::Command::new("python3")
        .args(["-c", &script])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_on_one_listener_leaves_the_others_and_the_database_working() {
    // The test itself holds the floods' client ends.
    troupe_listen::Descriptors::raise(0);
    let dir = tempfile::tempdir().unwrap();
    // The hostile agent, another uid, reaches the socket through it.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path().join("run/session.sock");
    let script = limited(dir.path());
    let console_port = ports::free_addr().port();
    let metrics_port = ports::free_addr().port();
    let log = dir.path().join("session.log");
    let data = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(data.path().join("data/agents")).unwrap();
    std::fs::write(
        data.path().join("data/agents/worker.md"),
        "---\nname: worker\ndescription: test agent\ncommand: [\"/bin/cat\"]\n---\n",
    )
    .unwrap();
    let service = SessionProcess::start_logging(
        &script,
        data,
        &[
            "--console-listen",
            &format!("127.0.0.1:{console_port}"),
            "--metrics-listen",
            &format!("127.0.0.1:{metrics_port}"),
            "--header-timeout-secs",
            "3",
            "--socket",
            socket.to_str().unwrap(),
        ],
        &[],
        Some(&log),
    );
    let root = service.create_root().await;

    let console: std::net::SocketAddr = format!("127.0.0.1:{console_port}").parse().unwrap();
    let held = floods::stall(console, FLOOD, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n").await;
    let mut agent = flood_socket(&socket);
    let mut opened = String::new();
    {
        use tokio::io::AsyncBufReadExt;
        let out = agent.stdout.take().unwrap();
        tokio::io::BufReader::new(out)
            .read_line(&mut opened)
            .await
            .unwrap();
    }
    assert!(opened.trim().parse::<usize>().unwrap() > 0, "{opened}");

    // The gRPC port answers at once, and the database works: a new session.
    for _ in 0..5 {
        let asked = Instant::now();
        let mut operator = service.operator().await;
        let listed = tokio::time::timeout(
            Duration::from_secs(5),
            operator.list_workspace_sessions(ListWorkspaceSessionsRequest {
                workspace_id: "alpha".into(),
                ..Default::default()
            }),
        )
        .await
        .expect("the gRPC port answers during the floods");
        assert!(listed.is_ok(), "{listed:?}");
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "{:?}",
            asked.elapsed()
        );
    }
    let child = service
        .spawn(&root)
        .await
        .expect("a spawn during the floods");
    assert!(child.session_id.starts_with("sess_"));

    // Another uid (the test's) still gets in on the agents' socket.
    let channel = troupe_proto::endpoint::connect(&format!("unix://{}", socket.display()))
        .await
        .expect("a connection of another agent");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("the agents' socket answers another agent");

    // The refusals are counted and logged.
    let scrape = reqwest_free_get(metrics_port, "/metrics").await;
    for listener in ["console", "agents"] {
        let refused = scrape
            .lines()
            .find(|l| {
                l.starts_with("troupe_listener_refused_total")
                    && l.contains(&format!("troupe_listener=\"{listener}\""))
            })
            .unwrap_or_else(|| panic!("no refusals of {listener} in {scrape}"));
        let n: f64 = refused.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(n > 0.0, "{refused}");
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("connections refused"), "{logged}");
    assert!(!logged.contains("Too many open files"), "{logged}");

    // The half-sent heads are cut after the header timeout: a new console
    // connection is served again.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let page = reqwest_free_get(console_port, "/").await;
    assert!(
        page.contains("<html") || page.contains("<!doctype"),
        "{page}"
    );
    drop(held);
    let _ = agent.kill().await;
    service.stop().await;
}

/// A plain HTTP/1.1 GET of `path` on 127.0.0.1:`port`; the body.
async fn reqwest_free_get(port: u16, path: &str) -> String {
    use tokio::io::AsyncReadExt;
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut answer))
        .await
        .expect("an answer")
        .unwrap();
    answer
}
