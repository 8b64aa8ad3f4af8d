//! Shared harness of Troupe's tests and benchmarks: a real session service on
//! `127.0.0.1:0` with its own data directory, and clients that carry a token.
//!
//! - [`TestServer`]: start, restart on the same data, stop (propagating server
//!   errors); on PostgreSQL, replicas sharing its database.
//! - [`Client`]: a `SessionService` client that sends `authorization: Bearer <token>`.
//! - [`reason`]: the `ErrorInfo` reason of a refusal.
//! - [`drain`]: what clients see of a server that stops.
//! - [`floods`]: hostile clients of a listener (stalled heads, silent connections).
//! - [`flags_doc`]: docs/flags.md against the binaries' `--help`.
//! - [`bench`]: percentiles of sequential calls, for the benchmarks.
//! - [`console`]: the web console over HTTP: a service serving it, a sign-in.
//! - [`browser`]: a headless Chromium driven through chromedriver (the console's).
//! - [`otlp`]: a real OTLP receiver, what it got, and a Prometheus scrape.
//! - [`process`]: a real `troupe-session` process, for its telemetry.
//! - [`lines`]: the JSON lines a streaming command prints, as they come.
//! - [`raw`]: calls made of hand-written wire bytes (fields that are not UTF-8).
//! - [`stores`]: stores opened directly, on either backend.
//! - [`upstream`]: a scripted model provider speaking the Anthropic Messages API.
//! - [`ports`]: loopback ports for servers started on an address chosen first.
//! - [`postgres`]: the backend switch (`TROUPE_TEST_BACKEND`) and fresh
//!   PostgreSQL databases.

pub mod bench;
pub mod browser;
pub mod console;
pub mod drain;
pub mod flags_doc;
pub mod floods;
pub mod gateway;
pub mod http;
pub mod lines;
pub mod otlp;
pub mod ports;
pub mod postgres;
pub mod process;
pub mod raw;
mod server;
pub mod stores;
pub mod upstream;

use tonic::{Status, service::interceptor::InterceptedService, transport::Channel};
use tonic_types::StatusExt;
pub use troupe_proto::endpoint::Bearer;
use troupe_proto::session::{self as pb, session_service_client::SessionServiceClient};

pub use server::TestServer;

/// A session service client that authenticates with one token.
pub type Client = SessionServiceClient<InterceptedService<Channel, Bearer>>;

/// The operator token every test server uses.
pub const OPERATOR_TOKEN: &str = "test-operator-token-0123456789abcdef";

/// An agent definition's Markdown, running `command`.
pub fn agent_definition(name: &str, command: &[&str]) -> String {
    let argv = serde_json::to_string(command).expect("JSON");
    format!(
        "---\nname: {name}\ndescription: {name} from the database\ncommand: {argv}\n---\nYou are {name}.\n"
    )
}

/// A child request with the test agent.
pub fn child(title: &str) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        title: title.to_owned(),
        agent_name: "worker".to_owned(),
        initial_message: format!("do {title}"),
        ..Default::default()
    }
}

/// The position in `workspace`'s shard a watch's cursor (an event's
/// `cursor`) stands at.
pub fn position(cursor: &str, workspace: &str) -> i64 {
    let cursor: troupe_session_svc::cursor::Cursor = cursor.parse().expect("a cursor");
    cursor.after(troupe_session_svc::shard::Shard::of(workspace))
}

/// Returns the `google.rpc.ErrorInfo` reason of a status, or "" without one.
pub fn reason(status: &Status) -> String {
    status
        .get_details_error_info()
        .map(|info| info.reason)
        .unwrap_or_default()
}

/// Returns an `ErrorInfo` metadata value of a status.
pub fn error_metadata(status: &Status, key: &str) -> Option<String> {
    status
        .get_details_error_info()
        .and_then(|info| info.metadata.get(key).cloned())
}

/// A message request without a request id.
pub fn message(session_id: impl Into<String>, text: impl Into<String>) -> pb::SendMessageRequest {
    pb::SendMessageRequest {
        session_id: session_id.into(),
        message: text.into(),
        request_id: String::new(),
    }
}

/// A termination request with the default reason.
pub fn terminate(session_id: impl Into<String>) -> pb::TerminateSessionRequest {
    pb::TerminateSessionRequest {
        session_id: session_id.into(),
        reason: String::new(),
    }
}

/// A get request.
pub fn get(session_id: impl Into<String>) -> pb::GetSessionRequest {
    pb::GetSessionRequest {
        session_id: session_id.into(),
    }
}

/// Creates a child as the client's session; panics with the refusal if refused.
pub async fn create_child(client: &mut Client, request: pb::CreateSessionRequest) -> pb::Session {
    client
        .create_session(request)
        .await
        .unwrap_or_else(|status| panic!("create refused: {status:?}"))
        .into_inner()
        .session
        .expect("a created session")
}

/// The first `limit` entries of `server`'s audit log, oldest first, as the
/// operator lists them.
pub async fn audit_log(server: &TestServer, limit: u32) -> Vec<pb::AuditEntry> {
    server
        .operator()
        .await
        .list_audit(pb::ListAuditRequest {
            limit,
            ..Default::default()
        })
        .await
        .expect("audit")
        .into_inner()
        .entries
}

/// Records an embedded runner (`default`, never called) in `store` for
/// `fence`'s term, so that `RunnerStore::start_process` places every process on
/// it: for tests of the store alone.
pub async fn embedded_runner<S: troupe_session_svc::store::Store>(
    store: &S,
    fence: &troupe_session_svc::store::Fence,
) {
    use troupe_session_svc::model::{RunnerName, RunnerSpec};
    let spec = RunnerSpec {
        name: RunnerName::embedded(),
        endpoint: "http://127.0.0.1:9".to_owned(),
        capacity: 64,
    };
    store
        .set_static_runner(fence, Some(&spec))
        .await
        .expect("embedded runner");
}
