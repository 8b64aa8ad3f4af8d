//! An agent's way to its model, with real parts: the supervisor's model port
//! on the workspace container's loopback (network `none`), forwarded to the
//! socket mounted where the session service's is. Here the scripted upstream
//! (`troupe_tests::upstream`) listens on that socket, standing where the
//! session service's model gateway will be. Also: the variables of an agent
//! definition's `env` reach the agent, and the real Claude Code CLI, in the
//! agent CLIs image, talks to the scripted upstream through the port.

use crate::common;

use std::{collections::HashMap, os::unix::fs::PermissionsExt, path::Path, time::Duration};

use common::{claude::claude_image, pair::Pair, *};
use troupe_proto::{
    runner::{ExitReason, StartExecRequest},
    session::SessionStatus,
};
use troupe_tests::upstream::{Turn, Upstream, Usage};

/// A directory for the socket, which every uid of the container may enter.
fn socket_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// A runner whose containers mount `socket`'s directory as the session service's.
async fn runner_for(socket: &Path, image: &str) -> TestRunner {
    let socket = socket.to_owned();
    let image = image.to_owned();
    TestRunner::start_with(move |c| {
        c.session_socket = Some(socket);
        c.image = image;
    })
    .await
}

fn exec(workspace: &str, id: &str, token: &str, command: &[&str]) -> StartExecRequest {
    let mut req = start_request(workspace, id, command);
    req.env = HashMap::from([(
        troupe_proto::agent::env::SESSION_TOKEN.to_owned(),
        token.to_owned(),
    )]);
    req
}

/// Prints the model variables (and writes the base URL to
/// `/workspace/base-<exec>`), posts one Messages call to
/// `$ANTHROPIC_BASE_URL` with `$ANTHROPIC_API_KEY` (busybox wget), prints
/// the answer, then waits for a line on stdin.
const CALLER: &str = r#"
echo "anthropic=$ANTHROPIC_BASE_URL openai=$OPENAI_BASE_URL akey=$ANTHROPIC_API_KEY okey=$OPENAI_API_KEY"
echo "$ANTHROPIC_BASE_URL" > "/workspace/base-$TROUPE_SESSION_ID"
wget -q -O - --header "x-api-key: $ANTHROPIC_API_KEY" --header 'content-type: application/json' \
  --post-data '{"model":"scripted-model","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}' \
  "$ANTHROPIC_BASE_URL/v1/messages"
echo
echo "called: $?"
read -r _
"#;

fn var<'a>(out: &'a str, name: &str) -> &'a str {
    out.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name}= in {out:?}"))
}

/// Two agents of one workspace container, each its own uid: each reaches
/// the socket's server through its own port on the container's loopback,
/// and each request carries that agent's session token as its key. A third
/// agent, another uid, that calls the first one's port is closed at once.
#[tokio::test]
async fn agents_reach_the_socket_over_their_own_loopback_ports_with_their_own_tokens() {
    let dir = socket_dir();
    let upstream = Upstream::unix(
        &dir.path().join("session.sock"),
        vec![Turn::text("answer for a"), Turn::text("answer for b")],
    )
    .await;
    let runner = runner_for(upstream.socket(), IMAGE).await;
    let ws = runner.workspace("model");
    let mut client = runner.client().await;
    let mut outputs = Vec::new();
    for (id, token) in [("a", "token-of-a"), ("b", "token-of-b")] {
        client
            .start_exec(exec(&ws, id, token, &["sh", "-c", CALLER]))
            .await
            .expect("start");
        wait_for_output(&mut client, id, "called: 0").await;
        outputs.push((id, token));
    }
    let seen = upstream.wait_for_requests(2, MINUTE).await;
    assert_eq!(seen.len(), 2, "{seen:#?}");
    upstream.push(Turn::text("answer for a stranger"));
    let stranger = run_sh(
        &runner,
        &ws,
        "c",
        "wget -q -O - --header \"x-api-key: $ANTHROPIC_API_KEY\" --post-data '{}' \
         \"$(cat /workspace/base-a)/v1/messages\"; echo \"stranger: $?\"",
    )
    .await;
    let out = stranger.stdout_text();
    assert!(
        out.contains("stranger: ") && !out.contains("stranger: 0"),
        "{out}"
    );
    assert!(!out.contains("answer for a stranger"), "{out}");
    assert_eq!(
        upstream.requests().len(),
        2,
        "the stranger's call went through"
    );
    let mut ports = Vec::new();
    for ((id, token), request) in outputs.into_iter().zip(&seen) {
        // Both still run: their ports are held at once.
        client
            .write_stdin(troupe_proto::runner::WriteStdinRequest {
                exec_id: id.into(),
                data: b"bye\n".to_vec(),
                ..Default::default()
            })
            .await
            .expect("stdin");
        let done = collect(&mut client, id, 0, MINUTE).await;
        let out = done.stdout_text();
        assert_eq!(done.exit.as_ref().map(|e| e.0), Some(0), "{done:?}");
        let base = var(&out, "anthropic");
        let port: u16 = base
            .strip_prefix("http://127.0.0.1:")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("a loopback base URL, not {base:?}"));
        assert_eq!(var(&out, "openai"), format!("{base}/v1"));
        assert_eq!(var(&out, "akey"), token);
        assert_eq!(var(&out, "okey"), token);
        assert!(out.contains(&format!("answer for {id}")), "{out}");
        assert_eq!(request.api_key(), Some(token), "{request:#?}");
        assert_eq!(request.uri, "/v1/messages");
        assert_eq!(request.body["model"], "scripted-model");
        if id == "a" {
            let err = done.stderr_text();
            assert!(
                err.contains("troupe-supervisor: model port: closed a connection of uid"),
                "{err}"
            );
        }
        ports.push(port);
    }
    assert_ne!(ports[0], ports[1], "each agent its own port");
}

/// With the session service on another host, the port forwards to the
/// runner's relay socket, mounted at the same path, and the relay on to the
/// service's TCP endpoint: here the scripted upstream's.
#[tokio::test]
async fn through_the_runners_relay_the_port_reaches_the_tcp_endpoint() {
    let upstream = Upstream::tcp(vec![Turn::text("relayed answer")]).await;
    let endpoint = upstream.base_url();
    let runner = TestRunner::start_with(move |c| c.session_endpoint = vec![endpoint]).await;
    let ws = runner.workspace("relay");
    let mut client = runner.client().await;
    client
        .start_exec(exec(&ws, "far", "token-of-far", &["sh", "-c", CALLER]))
        .await
        .expect("start");
    wait_for_output(&mut client, "far", "called: 0").await;
    let seen = upstream.wait_for_requests(1, MINUTE).await;
    assert_eq!(seen[0].api_key(), Some("token-of-far"));
    client
        .write_stdin(troupe_proto::runner::WriteStdinRequest {
            exec_id: "far".into(),
            data: b"bye\n".to_vec(),
            ..Default::default()
        })
        .await
        .expect("stdin");
    let out = collect(&mut client, "far", 0, MINUTE).await.stdout_text();
    assert!(out.contains("relayed answer"), "{out}");
}

/// With nothing at the socket the agent's call fails, and the agent runs on
/// to its own end; the supervisor says why in the exec's stderr.
#[tokio::test]
async fn a_missing_gateway_fails_the_call_not_the_agent() {
    let dir = socket_dir();
    let runner = runner_for(&dir.path().join("session.sock"), IMAGE).await;
    let ws = runner.workspace("nomodel");
    let done = run_sh(
        &runner,
        &ws,
        "lonely",
        "wget -q -O - --post-data '{}' \"$ANTHROPIC_BASE_URL/v1/messages\"; echo \"wget: $?\"; exit 7",
    )
    .await;
    let out = done.stdout_text();
    assert!(out.contains("wget: ") && !out.contains("wget: 0"), "{out}");
    assert_eq!(
        done.exit.as_ref().map(|e| (e.0, e.1)),
        Some((7, ExitReason::Exited))
    );
    let err = done.stderr_text();
    assert!(
        err.contains(
            "troupe-supervisor: model port: cannot reach /run/troupe/session/session.sock"
        ),
        "{err}"
    );
}

/// The variables of the agent's definition reach its command, beside
/// Troupe's, through the session service and the runner.
#[tokio::test]
async fn an_agent_sees_the_variables_of_its_definition() {
    let pair = Pair::start().await;
    let ws = pair.runner.workspace("env");
    pair.server.write_agent_text(
        Some(&ws),
        "greeter",
        "---\nname: greeter\ncommand: [\"sh\", \"-c\", \"echo \\\"$GREETING $TIMES $TROUPE_AGENT_NAME\\\"\"]\n\
         env:\n  GREETING: hello there\n  TIMES: 3\n---\n",
    );
    let root = pair.root(&ws, "greeter", "").await;
    let done = pair
        .wait_status(&root.session_id, SessionStatus::Completed)
        .await;
    let tail = done.result.unwrap().output_tail;
    assert!(tail.contains("hello there 3 greeter"), "{tail:?}");
}

/// The real Claude Code CLI, in the agent CLIs image with the network
/// `none`, run by the runner as an agent: it calls the scripted upstream
/// through its model port, with its session's token as its key, and
/// prints the scripted answer.
#[tokio::test]
async fn claude_code_talks_to_its_model_through_the_port_and_prints_the_answer() {
    let Some(image) = tokio::task::spawn_blocking(claude_image).await.unwrap() else {
        return;
    };
    let dir = socket_dir();
    let upstream = Upstream::unix(
        &dir.path().join("session.sock"),
        vec![
            Turn::text("The scripted model says: forty-two.").with_usage(Usage {
                input_tokens: 1200,
                output_tokens: 9,
                ..Usage::default()
            }),
        ],
    )
    .await;
    let runner = runner_for(upstream.socket(), &image).await;
    let ws = runner.workspace("claude");
    let mut client = runner.client().await;
    client
        .start_exec(exec(
            &ws,
            "claude",
            "token-of-claude",
            &[
                "claude",
                "-p",
                "What is six times seven?",
                "--output-format",
                "stream-json",
                "--verbose",
            ],
        ))
        .await
        .expect("start");
    let done = collect(&mut client, "claude", 0, Duration::from_secs(120)).await;
    let out = done.stdout_text();
    assert_eq!(
        done.exit.as_ref().map(|e| e.0),
        Some(0),
        "stdout {out}\nstderr {}",
        done.stderr_text()
    );
    // stream-json: the final `result` line carries the model's text.
    let result = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["type"] == "result")
        .unwrap_or_else(|| panic!("no result line in {out}"));
    assert_eq!(
        result["result"], "The scripted model says: forty-two.",
        "{result}"
    );
    // Claude Code read the usage of the stream as the upstream scripted it.
    assert_eq!(result["usage"]["input_tokens"], 1200, "{result}");
    assert_eq!(result["usage"]["output_tokens"], 9, "{result}");
    let seen = upstream.requests();
    let calls: Vec<_> = seen
        .iter()
        .filter(|r| r.uri.starts_with("/v1/messages?") || r.uri == "/v1/messages")
        .collect();
    assert_eq!(calls.len(), 1, "{seen:#?}");
    assert_eq!(calls[0].api_key(), Some("token-of-claude"));
    assert!(calls[0].streams(), "{:#?}", calls[0]);
    let text = calls[0].body.to_string();
    assert!(text.contains("What is six times seven?"), "{text}");
}
