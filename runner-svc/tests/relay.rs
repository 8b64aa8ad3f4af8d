//! The runner's relay (`--session-endpoint`): agents in containers with no
//! network reach a session service that serves TCP only, elsewhere, through
//! the runner's own socket, which passes their bytes on unchanged. A real
//! session service, a real runner, the real engine and the real bridge.

mod common;

use std::{path::Path, time::Duration};

use common::{pair::*, *};
use tokio::io::AsyncReadExt;
use tonic::Code;
use troupe_proto::session::{
    self as pb, CreateSessionRequest, ExecutionMode, ListAuditRequest, SessionStatus,
    session_service_client::SessionServiceClient,
};
use troupe_tests::{Bearer, Client, OPERATOR_TOKEN};

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

/// The demo agent, in the container, creates a child through `troupe-mcp`
/// over the relayed socket, and the child runs: the tree forms as with the
/// service's own socket, and the audit names the agent's own session as the
/// caller.
#[tokio::test]
async fn an_agent_builds_a_tree_through_the_relay() {
    require_agent_tools();
    let pair = Pair::relayed(live, |_| {}).await;
    let ws = pair.runner.workspace("relay-tree");
    for name in ["coordinator", "specialist"] {
        pair.agent_command(&ws, name, &["troupe-demo-agent"]);
    }
    let plan = serde_json::json!({
        "spawn": [{
            "agent": "specialist",
            "title": "child",
            "mode": "callback",
            "message": {"say": "child here", "reply": "child done"},
        }],
        "wait_messages": 1,
        "collect": true,
    });
    let root = pair.root(&ws, "coordinator", &plan.to_string()).await;
    let done = pair
        .wait_status(&root.session_id, SessionStatus::Completed)
        .await;
    let root_out = events(&done.result.unwrap().output_tail);
    let child = done.children.first().expect("a child");
    assert_eq!(
        (child.parent_session_id.as_str(), child.depth),
        (root.session_id.as_str(), 1)
    );
    let child_view = pair
        .wait_status(&child.session_id, SessionStatus::Completed)
        .await;
    let child_out = events(&child_view.result.unwrap().output_tail);
    assert!(
        child_out
            .iter()
            .any(|e| e["event"] == "say" && e["text"] == "child here"),
        "{child_out:?}"
    );
    assert!(
        root_out.iter().any(|e| e["event"] == "message"
            && e["from"] == format!("session:{}", child.session_id)
            && e["message"] == "child done"),
        "{root_out:?}"
    );

    // The service saw the agent's own token: the creation is the root's.
    let audit = pair
        .server
        .operator()
        .await
        .list_audit(ListAuditRequest {
            session_id: root.session_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries;
    let created = audit
        .iter()
        .find(|e| e.action == "create_session" && e.detail.contains(&child.session_id))
        .unwrap_or_else(|| panic!("no audit of the child's creation: {audit:?}"));
    assert_eq!(created.caller, format!("session:{}", root.session_id));
    assert!(created.allowed, "{created:?}");
}

/// With a dead endpoint first, each connection goes on to the live one.
#[tokio::test]
async fn an_agent_reaches_the_service_past_a_dead_endpoint() {
    require_agent_tools();
    let dead = dead_endpoint().await;
    let pair = Pair::relayed(|addr| vec![dead, format!("http://{addr}")], |_| {}).await;
    let ws = pair.runner.workspace("relay-dead");
    pair.agent_command(&ws, "lister", &["troupe-demo-agent"]);
    let root = pair
        .root(
            &ws,
            "lister",
            &serde_json::json!({"list": true}).to_string(),
        )
        .await;
    let done = pair
        .wait_status(&root.session_id, SessionStatus::Completed)
        .await;
    let out = events(&done.result.unwrap().output_tail);
    let listed = out
        .iter()
        .find(|e| e["event"] == "listed")
        .unwrap_or_else(|| panic!("nothing listed: {out:?}"));
    assert_eq!(
        listed["session_ids"],
        serde_json::json!([root.session_id]),
        "{out:?}"
    );
}

/// The relay adds no identity: a call through it is its token's session's
/// (the audit's caller), and a forged or absent token is refused by the
/// service, from the host's side of the socket and from an agent in the
/// container alike.
#[tokio::test]
async fn the_relay_passes_the_callers_identity_and_adds_none() {
    require_agent_tools();
    let pair = Pair::relayed(live, |_| {}).await;
    let ws = pair.runner.workspace("relay-identity");
    pair.agent(&ws, "holder", "sleep 1000");
    let root = pair.root(&ws, "holder", "hold").await;
    pair.wait_status(&root.session_id, SessionStatus::Running)
        .await;
    let socket = pair.relay_socket();

    let token = pair.server.token_for(&root.session_id).await;
    let mut as_root = through(&socket, Some(&token)).await;
    let child = as_root
        .create_session(CreateSessionRequest {
            title: "relayed".into(),
            agent_name: "holder".into(),
            initial_message: "hold".into(),
            mode: ExecutionMode::Async as i32,
            ..Default::default()
        })
        .await
        .expect("a create through the relay")
        .into_inner()
        .session
        .unwrap();
    assert_eq!(child.parent_session_id, root.session_id);
    let audit = pair
        .server
        .operator()
        .await
        .list_audit(ListAuditRequest {
            session_id: root.session_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries;
    let created = audit
        .iter()
        .find(|e| e.action == "create_session" && e.detail.contains(&child.session_id))
        .unwrap_or_else(|| panic!("no audit of the creation: {audit:?}"));
    assert_eq!(created.caller, format!("session:{}", root.session_id));

    // A token whose signature was changed, and no token at all.
    let (unsigned, signature) = token.rsplit_once('.').unwrap();
    let flipped = if signature.starts_with('A') { 'B' } else { 'A' };
    let forged = format!("{unsigned}.{flipped}{}", &signature[1..]);
    for (what, token) in [("forged", Some(forged.as_str())), ("absent", None)] {
        let mut client = through(&socket, token).await;
        let refused = client
            .get_session(troupe_tests::get(&root.session_id))
            .await
            .expect_err(what);
        assert_eq!(refused.code(), Code::Unauthenticated, "{what}: {refused:?}");
        let refused = client
            .create_root_session(pb::CreateRootSessionRequest {
                workspace_id: ws.clone(),
                agent_name: "holder".into(),
                initial_message: "x".into(),
                ..Default::default()
            })
            .await
            .expect_err(what);
        assert_eq!(refused.code(), Code::Unauthenticated, "{what}: {refused:?}");
    }

    // An agent in the container with a forged token gets nowhere either.
    pair.agent_command(
        &ws,
        "forger",
        &[
            "env",
            &format!("TROUPE_SESSION_TOKEN={forged}"),
            "troupe-demo-agent",
        ],
    );
    let forger = pair
        .root(
            &ws,
            "forger",
            &serde_json::json!({"list": true}).to_string(),
        )
        .await;
    let done = pair
        .wait_status(&forger.session_id, SessionStatus::Completed)
        .await;
    let out = events(&done.result.unwrap().output_tail);
    assert!(
        out.iter()
            .any(|e| e["event"] == "refused" && e["reason"] == "TOKEN_INVALID"),
        "{out:?}"
    );
    assert!(!out.iter().any(|e| e["event"] == "listed"), "{out:?}");
}

/// Past `--relay-max-connections`, a new connection is closed at once; the
/// ones within keep working, and a closed one makes room again.
#[tokio::test]
async fn connections_past_the_limit_are_closed_and_those_within_keep_working() {
    let pair = Pair::relayed(live, |c| c.relay_max_connections = 2).await;
    let socket = pair.relay_socket();
    let mut first = through(&socket, Some(OPERATOR_TOKEN)).await;
    let mut second = through(&socket, Some(OPERATOR_TOKEN)).await;
    let list = || pb::ListAuditRequest {
        limit: 1,
        ..Default::default()
    };
    first.list_audit(list()).await.expect("first");
    second.list_audit(list()).await.expect("second");

    let third = tokio::net::UnixStream::connect(&socket).await.unwrap();
    closed_at_once(third).await;
    first
        .list_audit(list())
        .await
        .expect("first, past the limit");
    second
        .list_audit(list())
        .await
        .expect("second, past the limit");

    drop(first);
    let deadline = tokio::time::Instant::now() + MINUTE;
    loop {
        if let Ok(mut again) =
            troupe_proto::endpoint::connect(&format!("unix://{}", socket.display()))
                .await
                .map(|c| {
                    SessionServiceClient::with_interceptor(
                        c,
                        Bearer::new(Some(OPERATOR_TOKEN)).unwrap(),
                    )
                })
            && again.list_audit(list()).await.is_ok()
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no room again after a relayed connection closed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    second.list_audit(list()).await.expect("second, at the end");
}

/// At a stop the relay stops accepting at once, open relays work on for the
/// drain time and are then closed; started again, the runner replaces the
/// stale socket at the same path, where an agent in the workspace's
/// existing container finds it.
#[tokio::test]
async fn the_relay_drains_at_a_stop_and_is_found_again_after_a_restart() {
    require_agent_tools();
    let mut pair = Pair::relayed(live, |c| c.shutdown_drain_ms = 3000).await;
    let ws = pair.runner.workspace("relay-restart");
    pair.agent_command(&ws, "lister", &["troupe-demo-agent"]);
    let list_plan = serde_json::json!({"list": true}).to_string();
    let before = pair.root(&ws, "lister", &list_plan).await;
    pair.wait_status(&before.session_id, SessionStatus::Completed)
        .await;

    let socket = pair.relay_socket();
    let mut open = through(&socket, Some(OPERATOR_TOKEN)).await;
    let idle = tokio::net::UnixStream::connect(&socket).await.unwrap();
    let list = || pb::ListAuditRequest {
        limit: 1,
        ..Default::default()
    };
    open.list_audit(list()).await.expect("before the stop");

    let during = async {
        let deadline = tokio::time::Instant::now() + MINUTE;
        while tokio::net::UnixStream::connect(&socket).await.is_ok() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the relay still accepts after the stop began"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        open.list_audit(list()).await
    };
    let ((), during) = tokio::join!(pair.runner.stop(), during);
    during.expect("an open relay works during the drain");
    ends(idle).await;

    let stale = std::fs::symlink_metadata(&socket).expect("the socket file is left");
    assert!(std::os::unix::fs::FileTypeExt::is_socket(
        &stale.file_type()
    ));
    pair.runner.start_again().await;
    through(&socket, Some(OPERATOR_TOKEN))
        .await
        .list_audit(list())
        .await
        .expect("through the new socket");
    let after = pair.root(&ws, "lister", &list_plan).await;
    let done = pair
        .wait_status(&after.session_id, SessionStatus::Completed)
        .await;
    let out = events(&done.result.unwrap().output_tail);
    assert!(out.iter().any(|e| e["event"] == "listed"), "{out:?}");
}

/// With no session endpoint reachable, the runner serves and runs agents;
/// only the relayed connections are closed.
#[tokio::test]
async fn an_unreachable_session_service_leaves_the_runner_serving() {
    let dead = dead_endpoint().await;
    let runner = TestRunner::start_with(|c| c.session_endpoint = vec![dead]).await;
    let socket = match runner.config.agent_socket().unwrap() {
        troupe_runner_svc::AgentSocket::Relayed { socket, .. } => socket,
        local => panic!("not relayed: {local:?}"),
    };
    for _ in 0..3 {
        closed_at_once(tokio::net::UnixStream::connect(&socket).await.unwrap()).await;
    }
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", runner.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let health = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health")
        .into_inner();
    assert_eq!(
        health.status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
    let ws = runner.workspace("relay-down");
    let ran = run_sh(&runner, &ws, "still", "echo still here").await;
    assert_eq!(ran.stdout_text(), "still here\n");
}

/// `--session-socket` and `--session-endpoint` exclude each other, as flags
/// and as variables, before anything starts.
#[tokio::test]
async fn the_local_socket_and_the_relay_exclude_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let run = async |args: &[&str], env: &[(&str, &str)]| {
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_troupe-runner"))
            .args(["--data-dir", dir.path().to_str().unwrap()])
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("TROUPE_SESSION_SOCKET")
            .env_remove("TROUPE_SESSION_ENDPOINT")
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let out = tokio::time::timeout(MINUTE, child.wait_with_output())
            .await
            .expect("the runner should refuse to start")
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (args, env) in [
        (
            &[
                "--session-socket",
                "/s.sock",
                "--session-endpoint",
                "http://h:1",
            ][..],
            &[][..],
        ),
        (
            &["--session-endpoint", "http://h:1"][..],
            &[("TROUPE_SESSION_SOCKET", "/s.sock")][..],
        ),
    ] {
        let (code, stderr) = run(args, env).await;
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains("cannot be used with"), "{stderr}");
    }
    let (code, stderr) = run(&["--session-endpoint", "unix:///s.sock"], &[]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("must be a TCP endpoint"), "{stderr}");
    // As a library, too.
    let mut config = troupe_runner_svc::Config::with_data_dir(dir.path());
    config.session_socket = Some("/s.sock".into());
    config.session_endpoint = vec!["http://h:1".into()];
    let err = config.agent_socket().unwrap_err().to_string();
    assert!(err.contains("exclude each other"), "{err}");
}
