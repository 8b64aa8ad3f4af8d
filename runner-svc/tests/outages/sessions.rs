//! Outages as sessions live them: the engine stopping under a running
//! session ends it lost and is survived, and a start not made before its
//! deadline fails its session.

use super::*;

/// The engine stops under a running session: the runner says NOT_SERVING,
/// the session ends lost with a reason, a session created meanwhile waits
/// (its start refused as UNAVAILABLE, at no cost of uid or directory); the
/// engine comes back: SERVING again, and the waiting session runs.
#[tokio::test]
async fn a_docker_outage_is_reported_ends_its_sessions_and_is_survived() {
    let mut engine = PrivateEngine::start().await;
    let host = engine.host();
    let pair = Pair::start_on(|c| c.docker_host = Some(host), |_| {}).await;
    let ws = pair.runner.workspace("outage");
    pair.agent(&ws, "holder", "sleep 1000");
    pair.agent(&ws, "greeter", "read -r m; echo \"after: $m\"");
    let held = pair.running_root(&ws, "holder", "hold").await;

    let mut health = pair.runner.health().await;
    let mut statuses = health
        .watch(HealthCheckRequest {
            service: SERVICE_NAME.into(),
        })
        .await
        .expect("health watch")
        .into_inner();
    watch_until(&mut statuses, ServingStatus::Serving).await;
    let next_uid = std::fs::read_to_string(pair.runner.config.state_dir().join("next_uid"))
        .expect("uid counter");

    engine.stop().await;

    watch_until(&mut statuses, ServingStatus::NotServing).await;
    assert_eq!(check(&mut health).await, ServingStatus::NotServing);
    let lost = wait_status_within(&pair, &held.session_id, SessionStatus::Failed, SOON).await;
    assert_eq!(lost.end_reason, "container_lost", "{lost:?}");
    let (reason, detail) = ended(&pair, &held.session_id).await;
    assert_eq!(reason, "container_lost");
    assert!(detail.contains("Docker engine stopped"), "{detail}");

    // A start while the engine is down waits for it.
    refused(&pair.runner, &ws, "refused", SOON).await;
    let late = pair.root(&ws, "greeter", "hello").await;
    // Longer than the driver's pause between attempts: it has retried.
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < until {
        let session = pair.get(&late.session_id).await.session.unwrap();
        assert_eq!(session.status(), SessionStatus::Pending, "{session:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!pair.runner.exec_dir(&ws, "refused").exists());
    assert!(!pair.runner.exec_dir(&ws, &late.session_id).exists());

    engine.start_again().await;

    watch_until(&mut statuses, ServingStatus::Serving).await;
    assert_eq!(check(&mut health).await, ServingStatus::Serving);
    let done = pair
        .wait_status(&late.session_id, SessionStatus::Completed)
        .await;
    assert!(
        done.result.unwrap().output_tail.contains("after: "),
        "the agent ran, in a container made again, and read its message"
    );
    // Refused starts took no uid: the one started after them took the next.
    let now = std::fs::read_to_string(pair.runner.config.state_dir().join("next_uid")).unwrap();
    assert_eq!(
        now.trim().parse::<u32>().unwrap(),
        next_uid.trim().parse::<u32>().unwrap() + 1
    );
}

/// A session whose agent cannot be started (the runner is down) stays
/// pending until its start deadline, then fails, saying why.
#[tokio::test]
async fn a_start_not_made_within_its_deadline_fails_the_session() {
    let mut pair = Pair::start_with(|c| c.start_deadline_secs = 2).await;
    let ws = pair.runner.workspace("deadline");
    pair.agent(&ws, "holder", "sleep 1000");
    pair.runner.stop().await;
    let root = pair.root(&ws, "holder", "hold").await;
    assert_eq!(
        pair.get(&root.session_id).await.session.unwrap().status(),
        SessionStatus::Pending
    );
    let failed = wait_status_within(&pair, &root.session_id, SessionStatus::Failed, SOON).await;
    assert_eq!(failed.end_reason, "lost", "{failed:?}");
    let (reason, detail) = ended(&pair, &root.session_id).await;
    assert_eq!(reason, "lost");
    assert!(
        detail.contains("not started within 2s") && detail.contains("runner is unavailable"),
        "{detail}"
    );
}
