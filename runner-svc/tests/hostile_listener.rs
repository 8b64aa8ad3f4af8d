//! The runner's gRPC listener against one address that holds silent
//! connections open: past the per-peer cap a connection is closed at once,
//! unread; the silent ones are closed after the idle timeout; and then a
//! gRPC call is answered. (The runner starts without a Docker engine, as
//! NOT_SERVING: its listener is all this is about.)

use std::{process::Stdio, time::Duration};

use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
use troupe_tests::{floods, http, ports};

const PER_PEER: usize = 8;
const IDLE_SECS: u64 = 3;

#[tokio::test]
async fn silent_connections_are_capped_per_peer_and_closed_when_idle() {
    let dir = tempfile::tempdir().expect("dir");
    let addr = ports::free_addr();
    let _runner = tokio::process::Command::new(env!("CARGO_BIN_EXE_troupe-runner"))
        .args(["--listen", &addr.to_string()])
        .args(["--data-dir", &dir.path().join("data").display().to_string()])
        .args(["--docker-host", "unix:///nonexistent/docker.sock"])
        .args(["--max-connections-per-peer", &PER_PEER.to_string()])
        .args(["--connection-idle-secs", &IDLE_SECS.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the runner starts");
    http::wait_listening(addr).await;

    // Silent connections: cut by the idle timeout.
    floods::capped_then_cut(addr, PER_PEER, b"", Duration::from_secs(IDLE_SECS)).await;

    // The flood gone, a call is answered.
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("a channel");
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health answers");
}
