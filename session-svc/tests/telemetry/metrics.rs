//! The service's metrics, scraped as Prometheus would and exported over
//! OTLP.

use super::*;

/// The service's metrics, scraped in the Prometheus format and exported
/// over OTLP: spawns by outcome and reason, their duration, the active
/// sessions by workspace and trust level, the messages kept for later.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_are_scraped_and_exported() {
    let (receiver, endpoint) = Receiver::start().await;
    let port = troupe_tests::ports::free_addr().port();
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let listen = metrics.to_string();
    let service = start(
        &["--max-depth", "1", "--metrics-listen", &listen],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
        ],
    );
    let root = service.create_root().await;
    let child = service.spawn(&root).await.unwrap().session_id;
    assert_eq!(
        service.spawn(&child).await.unwrap_err().code(),
        tonic::Code::ResourceExhausted
    );
    service.send(&root, &child).await;

    let text = scrape(metrics).await;
    let spawns = |kind, outcome, reason| {
        sample(
            &text,
            "troupe_spawns_total",
            &[
                ("troupe_spawn_kind", kind),
                ("troupe_spawn_outcome", outcome),
                ("troupe_refusal_reason", reason),
            ],
        )
    };
    assert_eq!(spawns("root", "created", "OK"), Some(1.0), "{text}");
    assert_eq!(spawns("child", "created", "OK"), Some(1.0), "{text}");
    assert_eq!(
        spawns("child", "refused", "DEPTH_EXCEEDED"),
        Some(1.0),
        "{text}"
    );
    let created_child = [
        ("troupe_spawn_kind", "child"),
        ("troupe_spawn_outcome", "created"),
    ];
    assert_eq!(
        sample(&text, "troupe_spawn_duration_seconds_count", &created_child),
        Some(1.0),
        "{text}"
    );
    let active = [
        ("troupe_workspace_id", "alpha"),
        ("troupe_trust_level", "direct"),
    ];
    assert_eq!(
        sample(&text, "troupe_sessions_active", &active),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "troupe_messages_queued_total", &[]),
        Some(1.0),
        "{text}"
    );

    service.terminate_session(&root, "done").await;
    // The gauge answers the store's last count when the store does not
    // answer at once (a busy machine) and asks again in the background.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let text = scrape(metrics).await;
        let now = sample(&text, "troupe_sessions_active", &active).unwrap_or(0.0);
        if now == 0.0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(service.stop().await);
    let exported = receiver.metric_names();
    for name in [
        "troupe.spawns",
        "troupe.spawn.duration",
        "troupe.sessions.active",
    ] {
        assert!(exported.iter().any(|n| n == name), "{name}: {exported:?}");
    }
}
