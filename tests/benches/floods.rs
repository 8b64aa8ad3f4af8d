//! Floods of slow connections at full size, against the `troupe-session`
//! binary (`target/release/troupe-session`, or `BENCH_SESSION_BIN`) on its
//! embedded defaults, with the console on and the agents' socket served:
//! 10,000 connections to the console that each send half a request head
//! (from 20 loopback addresses, so the per-address cap alone does not stop
//! them), and 10,000 connections of one agent (another uid, a Python child
//! of this process) to the agents' socket, where the gateway is served.
//! Meanwhile a client on the gRPC port times `ListWorkspaceSessions` calls.
//!
//! Prints the calls' p50, p99 and max before the floods, during them, and
//! after the heads are cut; how many connections each flood got admitted;
//! and the service's open descriptors and RSS during the floods.
//!
//! Run (as root: the agent flood changes uid):
//! `cargo build --release -p troupe-session-svc && cargo bench -p troupe-tests --bench floods`

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    os::unix::fs::PermissionsExt,
    path::Path,
    time::{Duration, Instant},
};

use tokio::{io::AsyncWriteExt, net::TcpSocket};
use troupe_proto::session::ListWorkspaceSessionsRequest;
use troupe_tests::{
    bench::{ms, percentile},
    process::SessionProcess,
};

const CONSOLE_FLOOD: usize = 10_000;
const SOCKET_FLOOD: usize = 10_000;
const ADDRESSES: u8 = 20;
const CALLS: usize = 500;
const AGENT_UID: u32 = 23_457;

fn binary() -> String {
    std::env::var("BENCH_SESSION_BIN").unwrap_or_else(|_| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/release/troupe-session")
            .display()
            .to_string()
    })
}

async fn latencies(service: &SessionProcess, calls: usize) -> Vec<Duration> {
    let mut operator = service.operator().await;
    let mut out = Vec::with_capacity(calls);
    for _ in 0..calls {
        let asked = Instant::now();
        let answered = tokio::time::timeout(
            Duration::from_secs(10),
            operator.list_workspace_sessions(ListWorkspaceSessionsRequest {
                workspace_id: "alpha".into(),
                ..Default::default()
            }),
        )
        .await;
        out.push(asked.elapsed());
        if !matches!(answered, Ok(Ok(_))) {
            println!("  a call failed or timed out: {answered:?}");
        }
    }
    out.sort();
    out
}

fn report(label: &str, sorted: &[Duration]) {
    println!(
        "{label:<34} p50 {:>9}  p99 {:>9}  max {:>9}",
        ms(percentile(sorted, 50.0)),
        ms(percentile(sorted, 99.0)),
        ms(*sorted.last().unwrap())
    );
}

/// Half-sent request heads to `console`, from [`ADDRESSES`] loopback
/// addresses; returns the streams still open once all were tried.
async fn flood_console(console: SocketAddr) -> Vec<tokio::net::TcpStream> {
    let mut held = Vec::new();
    for i in 0..CONSOLE_FLOOD {
        let from = IpAddr::V4(Ipv4Addr::new(127, 0, 1, 1 + (i % ADDRESSES as usize) as u8));
        let socket = TcpSocket::new_v4().unwrap();
        if socket.bind(SocketAddr::new(from, 0)).is_err() {
            continue;
        }
        if let Ok(Ok(mut stream)) =
            tokio::time::timeout(Duration::from_millis(500), socket.connect(console)).await
        {
            let _ = stream
                .write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                .await;
            held.push(stream);
        }
    }
    held
}

fn flood_socket(socket: &Path) -> tokio::process::Child {
    let script = format!(
        "import os, socket, time\n\
         os.setgid({AGENT_UID}); os.setuid({AGENT_UID})\n\
         held = []; refused = 0\n\
         for _ in range({SOCKET_FLOOD}):\n\
         \x20   s = socket.socket(socket.AF_UNIX)\n\
         \x20   try:\n\
         \x20       s.connect({socket:?}); held.append(s)\n\
         \x20   except OSError:\n\
         \x20       refused += 1\n\
         print(len(held), refused, flush=True)\n\
         time.sleep(3600)\n"
    );
    tokio::process::Command::new("python3")
        .args(["-c", &script])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3")
}

/// Of `held`, how many the service still holds open (a read would block):
/// the rest it closed at once.
async fn still_open(held: &mut [tokio::net::TcpStream]) -> usize {
    let mut open = 0;
    let mut buf = [0u8; 1];
    for stream in held.iter_mut() {
        if let Err(e) = stream.try_read(&mut buf)
            && e.kind() == std::io::ErrorKind::WouldBlock
        {
            open += 1;
        }
    }
    open
}

fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[tokio::main]
async fn main() {
    troupe_listen::Descriptors::raise(0);
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path().join("run/session.sock");
    let data = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(data.path().join("data/agents")).unwrap();
    std::fs::write(
        data.path().join("data/agents/worker.md"),
        "---\nname: worker\ndescription: bench agent\ncommand: [\"/bin/cat\"]\n---\n",
    )
    .unwrap();
    let console_port = troupe_tests::ports::free_addr().port();
    let log = dir.path().join("session.log");
    let service = SessionProcess::start_logging(
        &binary(),
        data,
        &[
            "--console-listen",
            &format!("127.0.0.1:{console_port}"),
            "--socket",
            socket.to_str().unwrap(),
        ],
        &[],
        Some(&log),
    );
    for _ in 0..20 {
        service.create_root().await;
    }
    let pid = service.pid();
    report("gRPC, no flood", &latencies(&service, CALLS).await);

    let started = Instant::now();
    let console: SocketAddr = format!("127.0.0.1:{console_port}").parse().unwrap();
    let mut held = flood_console(console).await;
    let mut agent = flood_socket(&socket);
    let mut line = String::new();
    {
        use tokio::io::AsyncBufReadExt;
        let out = agent.stdout.take().unwrap();
        tokio::io::BufReader::new(out)
            .read_line(&mut line)
            .await
            .unwrap();
    }
    println!(
        "floods opened in {:.1} s: console {} connected, {} held open by the service; agents' socket (admitted, refused at connect): {}",
        started.elapsed().as_secs_f64(),
        held.len(),
        still_open(&mut held).await,
        line.trim()
    );
    println!(
        "service during the floods: {} descriptors open, RSS {} MiB",
        descriptors(pid),
        service.rss_kib() / 1024
    );
    report(
        "gRPC, during both floods",
        &latencies(&service, CALLS).await,
    );
    tokio::time::sleep(Duration::from_secs(11)).await;
    println!(
        "after the header timeout (10 s): {} console connections still open",
        still_open(&mut held).await
    );
    report("gRPC, after", &latencies(&service, CALLS).await);
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    println!(
        "log: {} lines of refusals, {} of 'Too many open files'",
        logged.matches("connections refused").count(),
        logged.matches("Too many open files").count()
    );
    drop(held);
    let _ = agent.kill().await;
    service.stop().await;
}
