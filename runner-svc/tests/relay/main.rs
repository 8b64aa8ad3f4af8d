//! The runner's relay (`--session-endpoint`): agents in containers with no
//! network reach a session service that serves TCP only, elsewhere, through
//! the runner's own socket, which passes their bytes on unchanged. A real
//! session service, a real runner, the real engine and the real bridge.

use crate::common;

use std::{path::Path, time::Duration};

use common::{pair::*, *};
use tokio::io::AsyncReadExt;
use tonic::Code;
use troupe_proto::session::{
    self as pb, CreateSessionRequest, ExecutionMode, ListAuditRequest, SessionStatus,
    session_service_client::SessionServiceClient,
};
use troupe_tests::{Bearer, Client, OPERATOR_TOKEN};

mod agents;
mod config;
mod connections;
mod identity;

/// The session service's TCP endpoint.
fn live(addr: std::net::SocketAddr) -> Vec<String> {
    vec![format!("http://{addr}")]
}

/// An address nothing listens on: bound, then let go.
async fn dead_endpoint() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

/// A session-service client over the relay's socket, carrying `token`.
async fn through(socket: &Path, token: Option<&str>) -> Client {
    let channel = troupe_proto::endpoint::connect(&format!("unix://{}", socket.display()))
        .await
        .expect("connect through the relay");
    SessionServiceClient::with_interceptor(channel, Bearer::new(token).unwrap())
}

/// Waits until a connection to `socket` is closed by the other side with
/// nothing sent: what the relay does with one it does not relay.
async fn closed_at_once(mut stream: tokio::net::UnixStream) {
    let mut byte = [0u8; 1];
    match tokio::time::timeout(MINUTE, stream.read(&mut byte)).await {
        Ok(Ok(0)) | Ok(Err(_)) => {}
        Ok(Ok(n)) => panic!("the relay sent {n} bytes on a connection it should close"),
        Err(_) => panic!("the connection stayed open"),
    }
}

/// Waits until the other side closes `stream`, whatever it sent before
/// (a relayed connection carries the service's HTTP/2 settings).
async fn ends(mut stream: tokio::net::UnixStream) {
    let mut sink = Vec::new();
    tokio::time::timeout(MINUTE, stream.read_to_end(&mut sink))
        .await
        .expect("the connection stayed open")
        .ok();
}

/// The audit entry of `child`'s creation, among `root`'s.
async fn creation_of(pair: &Pair, root: &str, child: &str) -> pb::AuditEntry {
    let audit = pair
        .server
        .operator()
        .await
        .list_audit(ListAuditRequest {
            session_id: root.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries;
    audit
        .iter()
        .find(|e| e.action == "create_session" && e.detail.contains(child))
        .cloned()
        .unwrap_or_else(|| panic!("no audit of {child}'s creation: {audit:?}"))
}

/// A request for one audit entry: a call any token may make.
fn list() -> pb::ListAuditRequest {
    pb::ListAuditRequest {
        limit: 1,
        ..Default::default()
    }
}
