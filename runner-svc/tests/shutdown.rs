//! A stop of the `troupe-runner` binary (SIGTERM), whatever its clients
//! do: health says NOT_SERVING first, exec watches end with a status that
//! says to resume, new connections are refused, the process exits within
//! the drain time even while a client holds a call open, and the agents
//! keep running.

use crate::common;

use std::time::{Duration, Instant};

use common::{Bearer, IMAGE, TOKEN, remove_container, require_engine, start_request, tools};
use troupe_proto::runner::{
    WatchExecRequest, exec_event, runner_service_client::RunnerServiceClient,
    runner_service_server::SERVICE_NAME,
};
use troupe_runner_svc::docker::Engine;
use troupe_tests::drain::{
    assert_resume, assert_stops_accepting, assert_told_not_serving, health_watch, next_soon,
    stalled_call,
};

const DRAIN_MS: u64 = 1500;

#[tokio::test]
async fn a_stop_ends_every_stream_and_exits_within_the_drain_time() {
    require_engine();
    let dir = tempfile::tempdir().unwrap();
    let addr = troupe_tests::ports::free_addr();
    let mut runner = tokio::process::Command::new(env!("CARGO_BIN_EXE_troupe-runner"))
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--tools-dir")
        .arg(tools())
        .args([
            "--image",
            IMAGE,
            "--shutdown-drain-ms",
            &DRAIN_MS.to_string(),
        ])
        .env("TROUPE_OPERATOR_TOKEN", TOKEN)
        .kill_on_drop(true)
        .spawn()
        .expect("troupe-runner starts");
    let channel = connect(&format!("http://{addr}")).await;
    let mut client =
        RunnerServiceClient::with_interceptor(channel.clone(), Bearer::new(Some(TOKEN)).unwrap());
    let workspace = format!("t-stop-{}", std::process::id());
    client
        .start_exec(start_request(&workspace, "sleeper", &["sleep", "600"]))
        .await
        .expect("start");
    let mut events = client
        .watch_exec(WatchExecRequest {
            exec_id: "sleeper".into(),
            after_sequence: 0,
        })
        .await
        .expect("watch")
        .into_inner();
    let started = events.message().await.expect("an event").expect("started");
    assert_eq!(started.sequence, 1);
    let mut server_health = health_watch(channel.clone(), "").await;
    let mut service_health = health_watch(channel.clone(), SERVICE_NAME).await;
    let stalled = stalled_call(channel.clone(), "/troupe.runner.v1.RunnerService/ListExecs");

    let stopping = Instant::now();
    let pid = nix::unistd::Pid::from_raw(runner.id().expect("running") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    assert_told_not_serving(&mut server_health).await;
    assert_told_not_serving(&mut service_health).await;
    // Output the supervisor wrote (a note of its own) may come first; an
    // exit may not: the agent outlives its runner.
    let watch_end = loop {
        match next_soon(&mut events).await {
            Some(Ok(event)) => assert!(
                matches!(event.event, Some(exec_event::Event::Output(_))),
                "only output may come before the end: {event:?}"
            ),
            end => break end,
        }
    };
    assert_resume(watch_end.transpose().map(|e| e.map(|_| ())));
    assert_stops_accepting(addr).await;

    let exited = tokio::time::timeout(
        Duration::from_millis(DRAIN_MS) + Duration::from_secs(10),
        runner.wait(),
    )
    .await
    .expect("the runner exits within the drain time, a call still open")
    .unwrap();
    assert!(exited.success(), "a stop is a clean exit: {exited:?}");
    assert!(stopping.elapsed() >= Duration::from_millis(DRAIN_MS));
    stalled.abort();

    // The agent outlives its runner.
    let top = common::docker()
        .await
        .top_processes(
            &Engine::container_name(&workspace),
            None::<bollard::query_parameters::TopOptions>,
        )
        .await
        .expect("the container runs");
    let running = top
        .processes
        .unwrap_or_default()
        .iter()
        .any(|p| p.join(" ").contains("sleep 600"));
    remove_container(&workspace).await;
    assert!(running, "the agent keeps running after the runner stops");
}

async fn connect(endpoint: &str) -> tonic::transport::Channel {
    for _ in 0..400 {
        if let Ok(channel) = troupe_proto::endpoint::connect(endpoint).await {
            return channel;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("troupe-runner did not come up at {endpoint}");
}
