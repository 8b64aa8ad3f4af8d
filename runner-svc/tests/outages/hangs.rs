//! An engine that takes connections and answers nothing, from the start or
//! under a running exec, is not waited for.

use super::*;

/// An engine that takes connections and never answers (a socket nobody
/// serves) keeps the runner neither from starting nor its callers waiting:
/// NOT_SERVING, and starts refused as UNAVAILABLE within seconds.
#[tokio::test]
async fn a_runner_whose_engine_never_answers_starts_and_refuses_starts_quickly() {
    let dir = tempfile::Builder::new()
        .prefix("troupe-mute.")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let socket = dir.path().join("docker.sock");
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
    let mute = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    let host = format!("unix://{}", socket.display());
    let runner = TestRunner::start_with(|c| c.docker_host = Some(host)).await;
    let ws = runner.workspace("mute");
    assert_health(&runner, ServingStatus::NotServing).await;
    refused(&runner, &ws, "first", PROMPT).await;
    refused(&runner, &ws, "second", PROMPT).await;
    mute.abort();
}

/// The engine hangs under a running exec: a start made before the runner
/// knows is refused within the runner's call timeout, health goes
/// NOT_SERVING, later starts are refused at once, the exec's output still
/// reaches its watcher and the exec is not taken for lost; the engine
/// answers again: SERVING, and starts work.
#[tokio::test]
async fn an_engine_that_hangs_is_not_waited_for() {
    let engine = PrivateEngine::start().await;
    let host = engine.host();
    let runner = TestRunner::start_with(|c| c.docker_host = Some(host)).await;
    let ws = runner.workspace("hang");
    runner.sh(&ws, "ticker", TICKER).await;
    let mut watch = Watched::open(&runner, "ticker").await;
    watch.until(|text| text.contains("tick 1\n"), SOON).await;

    engine.hang();

    refused(&runner, &ws, "unaware", Duration::from_secs(15)).await;
    wait_health(&runner, ServingStatus::NotServing).await;
    refused(&runner, &ws, "aware", PROMPT).await;
    let seen = watch.ticks();
    watch.until(|text| ticks(text) >= seen + 10, SOON).await;

    engine.resume();

    wait_health(&runner, ServingStatus::Serving).await;
    let done = run_sh(&runner, &ws, "after", "echo up").await;
    assert_eq!(done.stdout_text(), "up\n");
    let seen = watch.ticks();
    watch.until(|text| ticks(text) >= seen + 3, SOON).await;
    assert!(watch.exit.is_none(), "{:?}", watch.exit);
}
