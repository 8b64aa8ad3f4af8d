//! The relay's configuration: a session service that cannot be reached
//! leaves the runner serving, and the local socket and the relay exclude
//! each other.

use super::*;

/// With no session endpoint reachable, the runner serves and runs agents;
/// only the relayed connections are closed.
#[tokio::test]
async fn an_unreachable_session_service_leaves_the_runner_serving() {
    let dead = dead_endpoint().await;
    let runner = TestRunner::start_with(|c| c.session_endpoint = vec![dead]).await;
    let socket = runner.relay_socket();
    for _ in 0..3 {
        closed_at_once(tokio::net::UnixStream::connect(&socket).await.unwrap()).await;
    }
    let health = runner
        .health()
        .await
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
