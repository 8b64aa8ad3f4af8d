//! A stop of the `troupe-session` binary (SIGTERM), whatever its clients
//! do: health says NOT_SERVING first, every stream ends with a status that
//! says to resume, new connections are refused, and the process exits
//! within the drain time even while a client holds a call open.

use std::time::{Duration, Instant};

use troupe_proto::session::{WatchSessionsRequest, session_service_server::SERVICE_NAME};
use troupe_tests::{
    drain::{
        assert_resume, assert_stops_accepting, assert_told_not_serving, health_watch, next_soon,
        stalled_call,
    },
    process::SessionProcess,
};

const DRAIN_MS: u64 = 1500;

#[tokio::test]
async fn a_stop_ends_every_stream_and_exits_within_the_drain_time() {
    let drain = DRAIN_MS.to_string();
    let mut service = SessionProcess::start(
        env!("CARGO_BIN_EXE_troupe-session"),
        &["--shutdown-drain-ms", &drain],
        &[],
    );
    let channel = service.channel().await;
    let mut server_health = health_watch(channel.clone(), "").await;
    let mut service_health = health_watch(channel.clone(), SERVICE_NAME).await;
    let mut events = service
        .operator()
        .await
        .watch_sessions(WatchSessionsRequest {
            live_only: true,
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    // A call that never sends its request: only the drain's bound ends it.
    let stalled = stalled_call(
        channel.clone(),
        "/troupe.session.v1.SessionService/GetSession",
    );

    let stopping = Instant::now();
    service.terminate().await;
    assert_told_not_serving(&mut server_health).await;
    assert_told_not_serving(&mut service_health).await;
    let watch_end = next_soon(&mut events).await;
    assert_resume(watch_end.transpose().map(|e| e.map(|_| ())));
    assert_stops_accepting(service.addr()).await;

    let exited = service
        .exited_within(Duration::from_millis(DRAIN_MS) + Duration::from_secs(10))
        .await
        .expect("the service exits within the drain time, a call still open");
    assert!(exited.success(), "a stop is a clean exit: {exited:?}");
    let took = stopping.elapsed();
    assert!(
        took >= Duration::from_millis(DRAIN_MS),
        "the open call had the drain time to finish ({took:?})"
    );
    stalled.abort();
}
