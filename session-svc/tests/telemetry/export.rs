//! Export as the standard `OTEL_*` variables configure it: where spans go,
//! the sampler and the service name; nothing exported without them, and
//! nothing blocked by a receiver that is down; export's threads below the
//! serving ones.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn spans_reach_an_otlp_receiver_named_by_the_standard_variables() {
    let (receiver, endpoint) = Receiver::start().await;
    let service = start(
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test"),
        ],
    );
    service.create_root().await;
    assert!(service.stop().await, "clean exit");
    let spans = receiver.spans();
    let created = named(&spans, "create_root");
    assert_eq!(lookup(&created.resource, "service.name"), "troupe-session");
    assert_eq!(lookup(&created.resource, "deployment.environment"), "test");
}

/// The sampler and the service name come from the standard variables.
#[tokio::test(flavor = "multi_thread")]
async fn the_sampler_and_the_service_name_are_the_environments() {
    let (receiver, endpoint) = Receiver::start().await;
    let unsampled = start(
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_TRACES_SAMPLER", "always_off"),
        ],
    );
    let root = unsampled.create_root().await;
    unsampled.spawn(&root).await.expect("spawn");
    assert!(unsampled.stop().await);
    assert!(
        receiver.spans().is_empty(),
        "always_off samples nothing: {:#?}",
        receiver.spans()
    );

    let named_service = start(
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_SERVICE_NAME", "sessions-eu"),
        ],
    );
    named_service.create_root().await;
    assert!(named_service.stop().await);
    let spans = receiver.spans();
    assert_eq!(
        lookup(&named(&spans, "create_root").resource, "service.name"),
        "sessions-eu"
    );
}

/// Export has threads of its own, at a lower CPU priority than the ones
/// that serve calls: the export thread (whose runtime encodes and sends
/// the batches) and the SDK's span and metric threads started from it.
#[tokio::test(flavor = "multi_thread")]
async fn export_runs_below_the_serving_threads_priority() {
    let (receiver, endpoint) = Receiver::start().await;
    let service = exporting(&endpoint, &[]);
    service.create_root().await;
    let threads = service.threads();
    let nice = |name: &str| -> Vec<i32> {
        let of_name: Vec<i32> = threads
            .iter()
            .filter(|(thread, _)| thread == name)
            .map(|(_, nice)| *nice)
            .collect();
        assert!(!of_name.is_empty(), "no thread {name}: {threads:?}");
        of_name
    };
    let serving = nice("tokio-rt-worker");
    assert!(serving.iter().all(|n| *n == serving[0]), "{threads:?}");
    // Thread names as the kernel keeps them: 15 bytes.
    for exporting in ["troupe-export", "OpenTelemetry.T", "OpenTelemetry.M"] {
        for n in nice(exporting) {
            assert!(n > serving[0], "{exporting}: {threads:?}");
        }
    }
    assert!(service.stop().await);
    assert!(!receiver.spans().is_empty(), "spans still leave");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_an_endpoint_nothing_is_exported_and_a_dead_receiver_blocks_nothing() {
    // The receiver listens, but nothing names it: it gets nothing, and the
    // service traces nothing (no session is given a trace).
    let (receiver, _endpoint) = Receiver::start().await;
    let quiet = start(&[], &[("OTEL_SERVICE_NAME", "quiet")]);
    let root = quiet.create_root_in(None).await.session.expect("a session");
    assert_eq!(root.trace_id, "", "no trace without export");
    assert!(quiet.stop().await);
    assert!(receiver.spans().is_empty());

    // A receiver that is down: calls are served and the stop is clean.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let service = start(&[], &[("OTEL_EXPORTER_OTLP_ENDPOINT", dead.as_str())]);
    for _ in 0..3 {
        service.create_root().await;
    }
    assert!(service.stop().await, "clean exit with the receiver down");
}
