//! A runner started, or restarted, while its engine is down serves anyway
//! and waits for it.

use super::*;

/// A runner started while its engine is down serves anyway: NOT_SERVING,
/// its starts refused as UNAVAILABLE at no cost; once the engine answers,
/// SERVING, and its starts work.
#[tokio::test]
async fn a_runner_started_while_the_engine_is_down_serves_and_waits_for_it() {
    let mut engine = PrivateEngine::start().await;
    engine.stop().await;
    let host = engine.host();
    let runner = TestRunner::start_with(|c| c.docker_host = Some(host)).await;
    let ws = runner.workspace("down-at-start");
    assert_health(&runner, ServingStatus::NotServing).await;
    refused(&runner, &ws, "early", SOON).await;

    engine.start_again().await;

    wait_health(&runner, ServingStatus::Serving).await;
    let done = run_sh(&runner, &ws, "late", "echo up").await;
    assert_eq!(done.stdout_text(), "up\n");
    assert_eq!(done.exit, Some((0, ExitReason::Exited, String::new())));
}

/// A runner restarted while its engine is down serves the execs it finds
/// in its state directory: their logs are read, and an exec whose process
/// ended with the engine is told so (container lost) without the engine;
/// once the engine answers, starts work again.
#[tokio::test]
async fn a_runner_restarted_while_the_engine_is_down_serves_and_judges_its_execs() {
    let mut engine = PrivateEngine::start().await;
    let host = engine.host();
    let mut runner = TestRunner::start_with(|c| c.docker_host = Some(host)).await;
    let ws = runner.workspace("down-at-restart");
    runner.sh(&ws, "ticker", TICKER).await;
    let mut watch = Watched::open(&runner, "ticker").await;
    watch.until(|text| text.contains("tick 2\n"), SOON).await;
    runner.stop().await;
    // The exec's process ends with its container.
    engine.stop().await;

    runner.start_again().await;

    assert_health(&runner, ServingStatus::NotServing).await;
    refused(&runner, &ws, "refused", SOON).await;
    let out = collect(&mut runner.client().await, "ticker", 0, SOON).await;
    assert!(
        out.stdout_text().starts_with("tick 0\ntick 1\ntick 2\n"),
        "{:?}",
        out.stdout_text()
    );
    let (code, reason, detail) = out.exit.expect("an exit");
    assert_eq!((code, reason), (-1, ExitReason::ContainerLost), "{detail}");
    assert!(detail.contains("Docker engine stopped"), "{detail}");

    engine.start_again().await;

    wait_health(&runner, ServingStatus::Serving).await;
    let done = run_sh(&runner, &ws, "again", "echo up").await;
    assert_eq!(done.stdout_text(), "up\n");
}
