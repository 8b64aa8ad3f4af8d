//! Harness of the bridge's tests: `troupe-mcp` driven by the official MCP
//! Python SDK (`tests/mcp_client.py`) on a plan of connections and calls,
//! the shapes of its answers, and `troupe-mcp http` on a free port.
//!
//! Every bridge a test starts is stopped the way its users stop it: a stdio
//! bridge by the end of its input, the HTTP one by SIGTERM. It then exits
//! through `main`, as it does in production, and a coverage run gets its
//! profile (a killed process writes none).

use std::{
    process::{ExitStatus, Stdio},
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    process::{Child, Command},
};
use troupe_proto::session as pb;
use troupe_tests::{TestServer, get};

pub const BRIDGE: &str = env!("CARGO_BIN_EXE_troupe-mcp");
pub const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_client.py");
pub const TOOLS: [&str; 14] = [
    "create_session",
    "send_message",
    "list_workspace_sessions",
    "get_session",
    "wait_for_session",
    "terminate_session",
    "report_progress",
    "finish",
    "reply_to_parent",
    "broadcast",
    "create_group",
    "add_to_group",
    "post_to_group",
    "list_groups",
];

pub fn require_python_mcp() {
    let importable = std::process::Command::new("python3")
        .args(["-c", "import mcp"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        importable,
        "these tests drive troupe-mcp with the MCP Python SDK, and `python3 -c 'import mcp'` \
         failed: pip install mcp (python3 -m pip install 'mcp>=2,<3')"
    );
}

/// Starts the Python client on `connections` without waiting for it.
pub async fn spawn_client(connections: Vec<Value>) -> Child {
    require_python_mcp();
    let mut child = Command::new("python3")
        .arg(CLIENT)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs");
    let plan = json!({ "connections": connections }).to_string();
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(plan.as_bytes())
        .await
        .expect("plan written");
    drop(stdin);
    child
}

/// Waits for the client; returns what each connection saw.
pub async fn finish_client(child: Child) -> Vec<Value> {
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the MCP client finished within 60 s")
        .expect("client output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the MCP client failed:\n{stderr}");
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("client output is not JSON ({e}):\n{stderr}"));
    let connections = report["connections"]
        .as_array()
        .expect("connections")
        .clone();
    for connection in &connections {
        assert!(
            connection.get("error").is_none(),
            "a connection failed: {connection}\nclient stderr:\n{stderr}"
        );
    }
    connections
}

pub async fn drive(connections: Vec<Value>) -> Vec<Value> {
    finish_client(spawn_client(connections).await).await
}

pub fn call(name: &str, arguments: Value) -> Value {
    json!({ "name": name, "arguments": arguments })
}

/// A stdio connection: the bridge as a subprocess with the session's environment.
pub fn stdio(endpoint: &str, token: &str, calls: Vec<Value>) -> Value {
    let mut env = json!({ "TROUPE_SESSION_TOKEN": token, "TROUPE_SESSION_ENDPOINT": endpoint });
    for (name, value) in passed_on() {
        env[name] = json!(value);
    }
    json!({ "transport": "stdio", "command": BRIDGE, "env": env, "calls": calls })
}

/// The variables of the test's own environment a bridge started with a
/// cleared one still gets: where a coverage run (`LLVM_PROFILE_FILE`)
/// writes its profile. The MCP client gives a server only the variables it
/// is told, and a few safe ones.
pub fn passed_on() -> Vec<(&'static str, String)> {
    ["LLVM_PROFILE_FILE"]
        .into_iter()
        .filter_map(|name| std::env::var(name).ok().map(|value| (name, value)))
        .collect()
}

/// An HTTP connection with these headers.
pub fn http(url: &str, headers: Value, calls: Vec<Value>) -> Value {
    json!({ "transport": "http", "url": url, "headers": headers, "calls": calls })
}

pub fn bearer(token: &str) -> Value {
    json!({ "Authorization": format!("Bearer {token}") })
}

/// The structured value of a successful call, checked against its text.
pub fn ok(result: &Value) -> &Value {
    assert_ne!(result["isError"], true, "the call failed: {result}");
    let value = &result["structuredContent"];
    let text = result["content"][0]["text"].as_str().expect("text content");
    let parsed: Value = serde_json::from_str(text).expect("the text is JSON");
    assert_eq!(&parsed, value, "text and structured content agree");
    value
}

/// The text of a refused call, after checking its structured reason.
pub fn refused(result: &Value, reason: &str) -> String {
    assert_eq!(result["isError"], true, "expected a refusal: {result}");
    assert_eq!(
        result["structuredContent"]["error"]["reason"], reason,
        "{result}"
    );
    let text = result["content"][0]["text"]
        .as_str()
        .expect("text")
        .to_owned();
    assert!(text.contains(reason), "{text}");
    text
}

/// The advice a refused call gives, checked to be the text's second line.
pub fn advice(result: &Value) -> String {
    let advice = result["structuredContent"]["error"]["advice"]
        .as_str()
        .unwrap_or_else(|| panic!("a refusal with advice: {result}"))
        .to_owned();
    let text = result["content"][0]["text"].as_str().expect("text");
    assert_eq!(text.lines().nth(1), Some(advice.as_str()), "{result}");
    advice
}

/// A `create_session` call of the agent `worker`, with `extra` arguments.
pub fn create(title: &str, extra: Value) -> Value {
    let mut arguments = json!({"title": title, "agent_name": "worker", "initial_message": "go"});
    if let Value::Object(extra) = extra {
        arguments.as_object_mut().expect("object").extend(extra);
    }
    call("create_session", arguments)
}

/// The id of the session a successful `create_session` made.
pub fn created_id(result: &Value) -> String {
    ok(result)["session"]["session_id"]
        .as_str()
        .expect("the new session's id")
        .to_owned()
}

pub fn ids(list: &Value) -> Vec<String> {
    let mut ids: Vec<String> = list["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| s["session_id"].as_str().expect("id").to_owned())
        .collect();
    ids.sort();
    ids
}

pub fn sorted(ids: &[&str]) -> Vec<String> {
    let mut ids: Vec<String> = ids.iter().map(|s| (*s).to_owned()).collect();
    ids.sort();
    ids
}

pub fn unix_endpoint(server: &TestServer) -> String {
    let socket = server
        .config
        .socket()
        .expect("the service serves a Unix socket");
    format!("unix://{}", socket.display())
}

pub async fn inbox_count(server: &TestServer, session_id: &str) -> u64 {
    server
        .operator()
        .await
        .get_session(get(session_id))
        .await
        .expect("get")
        .into_inner()
        .inbox_count
}

/// Waits until `caller` has opened `count` watches on `session_id` (the
/// audit log records each).
pub async fn watches_opened(
    server: &TestServer,
    session_id: &str,
    caller: &str,
    count: usize,
) -> bool {
    let mut operator = server.operator().await;
    for _ in 0..600 {
        let entries = operator
            .list_audit(pb::ListAuditRequest {
                session_id: session_id.to_owned(),
                after_id: 0,
                limit: 1000,
            })
            .await
            .expect("audit")
            .into_inner()
            .entries;
        let watches = entries
            .iter()
            .filter(|e| e.action == "watch_sessions" && e.caller == caller)
            .count();
        if watches >= count {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// How long a stopped bridge gets to exit: more than its default drain time.
pub const STOP_WITHIN: Duration = Duration::from_secs(10);

/// Sends SIGTERM to `pid`, as an operator's `kill` (or a service manager) does.
pub fn terminate(pid: u32) {
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success(), "SIGTERM sent to {pid}");
}

/// `troupe-mcp http` on a free port. [`HttpBridge::stop`] stops it as an
/// operator does and checks that it exits cleanly; dropped unstopped (a
/// test that failed), it is sent SIGTERM too, and killed only if it has
/// not exited within [`STOP_WITHIN`].
pub struct HttpBridge {
    pub url: String,
    pub child: Child,
}

impl HttpBridge {
    pub async fn start(endpoint: &str) -> HttpBridge {
        HttpBridge::start_with(endpoint, &[]).await
    }

    /// Starts the bridge with `flags` besides its listen address and endpoint.
    pub async fn start_with(endpoint: &str, flags: &[&str]) -> HttpBridge {
        let mut child = Command::new(BRIDGE)
            .args(["http", "--listen", "127.0.0.1:0", "--endpoint", endpoint])
            .args(flags)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("bridge starts");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let url = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(line) = lines.next_line().await.expect("stderr line") {
                if let Some(at) = line.find("serving MCP on ") {
                    let rest = &line[at + "serving MCP on ".len()..];
                    return rest.split_whitespace().next().expect("url").to_owned();
                }
            }
            panic!("the bridge exited before listening");
        })
        .await
        .expect("the bridge listens within 10 s");
        // Keep draining its log so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        HttpBridge { url, child }
    }

    /// Sends SIGTERM and waits for the exit, which must come within
    /// [`STOP_WITHIN`] and be a success.
    pub async fn stop(mut self) {
        let status = self.stop_within(STOP_WITHIN).await;
        assert!(status.success(), "a stop is a clean exit: {status:?}");
    }

    /// Sends SIGTERM and returns the exit status, which must come within `limit`.
    pub async fn stop_within(&mut self, limit: Duration) -> ExitStatus {
        if let Some(pid) = self.child.id() {
            terminate(pid);
        }
        tokio::time::timeout(limit, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the bridge did not exit within {limit:?} of SIGTERM"))
            .expect("wait for the bridge")
    }
}

impl Drop for HttpBridge {
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        let deadline = Instant::now() + STOP_WITHIN;
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.start_kill();
    }
}
