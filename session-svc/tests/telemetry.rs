//! The `troupe-session` binary's telemetry, at a real OTLP receiver (the
//! services of `opentelemetry-proto`, on loopback), configured only by the
//! standard `OTEL_*` variables: request and spawn spans, each spawn tree as
//! one trace of session lives, metrics (also scraped as Prometheus would);
//! nothing exported without the variables; serving as usual when the
//! receiver is down.

use troupe_proto::session::{
    CreateRootSessionRequest, CreateSessionRequest, GetSessionRequest, TerminateSessionRequest,
    TrustLevel,
};
use troupe_tests::{
    otlp::{Receiver, life_of, lookup, named, sample, scrape, spawn_of},
    process::SessionProcess,
};

/// Starts the `troupe-session` binary with `flags` and `env`.
fn start(flags: &[&str], env: &[(&str, &str)]) -> SessionProcess {
    SessionProcess::start(env!("CARGO_BIN_EXE_troupe-session"), flags, env)
}

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

/// A spawn's span names the session it made (Troupe's attributes and the
/// GenAI agent conventions), and a refused spawn's span names the reason.
#[tokio::test(flavor = "multi_thread")]
async fn spawn_spans_carry_the_session_and_the_refusal() {
    let (receiver, endpoint) = Receiver::start().await;
    let service = start(
        &["--max-depth", "0"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())],
    );
    let root = service.create_root().await;
    assert_eq!(
        service.spawn(&root).await.unwrap_err().code(),
        tonic::Code::ResourceExhausted
    );
    assert!(service.stop().await);

    let spans = receiver.spans();
    let created = named(&spans, "create_root");
    assert_eq!(created.get("troupe.session.id"), root);
    assert_eq!(created.get("gen_ai.agent.id"), root);
    assert_eq!(created.get("gen_ai.agent.name"), "worker");
    assert_eq!(created.get("gen_ai.operation.name"), "create_agent");
    assert_eq!(created.get("troupe.workspace.id"), "alpha");
    assert_eq!(created.get("troupe.trust_level"), "direct");
    assert_eq!(created.get("troupe.depth"), "0");
    assert!(created.get("troupe.tree.id").starts_with("tree_"));

    let refused = named(&spans, "spawn");
    assert_eq!(refused.get("troupe.refusal.reason"), "DEPTH_EXCEEDED");
    assert_eq!(refused.get("troupe.session.id"), "");
}

/// A call that carries a `traceparent` is traced inside the caller's trace.
/// A spawn's request is served in its spawn span, a child of the caller's
/// span; other calls in a request span.
#[tokio::test(flavor = "multi_thread")]
async fn a_callers_traceparent_is_continued() {
    let (receiver, endpoint) = Receiver::start().await;
    let service = start(&[], &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())]);
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let traceparent = format!("00-{trace}-{caller_span}-01");
    let root = service
        .create_root_in(Some(&traceparent))
        .await
        .session
        .expect("a session");
    let mut operator = service.operator().await;
    let mut request = tonic::Request::new(GetSessionRequest {
        session_id: root.session_id.clone(),
    });
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    operator.get_session(request).await.expect("get");
    assert!(service.stop().await);
    let spans = receiver.spans();
    let spawn = named(&spans, "create_root");
    assert_eq!(
        (spawn.trace.as_str(), spawn.parent.as_str()),
        (trace, caller_span)
    );
    assert_eq!(spawn.get("rpc.system"), "grpc");
    assert!(
        !spans.iter().any(|s| s.name.ends_with("/CreateRootSession")),
        "one span for the spawn's request: {spans:#?}"
    );
    let get = named(&spans, "/troupe.session.v1.SessionService/GetSession");
    assert_eq!(
        (get.trace.as_str(), get.parent.as_str()),
        (trace, caller_span)
    );
}

/// An agent's spawn called from a trace other than its tree's (one the
/// agent started itself) is in the tree's trace, under the agent's life,
/// and linked to the calling span, so both traces lead to it.
#[tokio::test(flavor = "multi_thread")]
async fn a_spawn_called_from_another_trace_stays_in_the_tree_and_links_the_call() {
    let (receiver, endpoint) = Receiver::start().await;
    let service = start(&[], &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())]);
    let root = service.create_root_in(None).await;
    let root_id = root.session.expect("a session").session_id;
    let (other_trace, calling_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let mut request = tonic::Request::new(CreateSessionRequest {
        agent_name: "worker".into(),
        ..Default::default()
    });
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{other_trace}-{calling_span}-01")
            .parse()
            .unwrap(),
    );
    let mut agent = service.client(&root.session_token).await;
    let child = agent
        .create_session(request)
        .await
        .expect("spawn")
        .into_inner()
        .session
        .expect("a session");
    service
        .operator()
        .await
        .terminate_session(TerminateSessionRequest {
            session_id: root_id.clone(),
            reason: "done".into(),
        })
        .await
        .unwrap();
    assert!(service.stop().await);

    let spans = receiver.spans();
    let root_life = life_of(&spans, &root_id);
    let spawn = spawn_of(&spans, &child.session_id);
    assert_eq!(spawn.trace, child.trace_id);
    assert_eq!(
        (&spawn.trace, &spawn.parent),
        (&root_life.trace, &root_life.id),
        "in the tree, under the caller's life"
    );
    assert_eq!(
        spawn.links,
        [(other_trace.to_owned(), calling_span.to_owned())],
        "linked to the call"
    );
}

/// A caller without a valid token never gets as far as a spawn: its
/// spawn span carries the refusal and no session, for a root or a child,
/// and is not in the tree's trace it named.
#[tokio::test(flavor = "multi_thread")]
async fn an_unauthenticated_spawn_is_refused_in_its_span() {
    let (receiver, endpoint) = Receiver::start().await;
    let service = start(&[], &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())]);
    let root = service.create_root().await;
    let mut stranger = service.client("not-a-token").await;
    let refused = stranger
        .create_root_session(CreateRootSessionRequest {
            workspace_id: "alpha".into(),
            trust_level: TrustLevel::Direct as i32,
            agent_name: "worker".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let refused = stranger
        .create_session(CreateSessionRequest {
            parent_session_id: root.clone(),
            agent_name: "worker".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    assert!(service.stop().await);

    let spans = receiver.spans();
    let spawns: Vec<_> = spans
        .iter()
        .filter(|s| matches!(s.name.as_str(), "spawn" | "create_root"))
        .collect();
    assert_eq!(spawns.len(), 3, "{spawns:#?}");
    let made = named(&spans, "create_root");
    assert_eq!(made.get("troupe.session.id"), root);
    let refused: Vec<_> = spawns
        .iter()
        .filter(|s| s.get("troupe.session.id").is_empty())
        .collect();
    assert_eq!(refused.len(), 2, "{spawns:#?}");
    for span in refused {
        assert_eq!(span.get("troupe.refusal.reason"), "TOKEN_INVALID");
        assert_ne!(span.trace, made.trace, "a stranger joins no tree");
    }
}

/// Export has threads of its own, at a lower CPU priority than the ones
/// that serve calls: the export thread (whose runtime encodes and sends
/// the batches) and the SDK's span and metric threads started from it.
#[tokio::test(flavor = "multi_thread")]
async fn export_runs_below_the_serving_threads_priority() {
    let (receiver, endpoint) = Receiver::start().await;
    let service = start(&[], &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())]);
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

/// A tree is one trace whose nesting is the tree: each session's life span
/// hangs under the spawn span that made it, which hangs under its parent's
/// life span; messages are events of the recipient's life, and links to
/// the sender's when they cross branches. The ids survive a restart of the
/// service between the spawns and the ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_spawn_tree_is_one_trace_shaped_like_the_tree() {
    let (receiver, endpoint) = Receiver::start().await;
    let otel = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())];
    let flags = ["--max-depth", "2"];
    let service = start(&flags, &otel);
    let root = service.create_root().await;
    let child = service.spawn(&root).await.unwrap().session_id;
    let sibling = service.spawn(&root).await.unwrap().session_id;
    let grandchild = service.spawn(&child).await.unwrap().session_id;

    // Restarted on the same data: the lives planned before are kept.
    let (clean, dir) = service.stop_keeping_data().await;
    assert!(clean);
    let service = dir.start(&flags, &otel);
    service.create_root().await; // waits until it answers
    assert_eq!(
        service.spawn(&grandchild).await.unwrap_err().code(),
        tonic::Code::ResourceExhausted
    );
    service.send(&child, &grandchild).await;
    service.send(&sibling, &grandchild).await;
    let trace_id = service
        .operator()
        .await
        .get_session(troupe_tests::get(&grandchild))
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap()
        .trace_id;
    service
        .operator()
        .await
        .terminate_session(TerminateSessionRequest {
            session_id: root.clone(),
            reason: "done".into(),
        })
        .await
        .unwrap();
    assert!(service.stop().await);

    let spans = receiver.spans();
    let life = |session: &str| life_of(&spans, session);
    let spawned = |session: &str| spawn_of(&spans, session);
    let root_life = life(&root);
    assert_eq!(root_life.trace, trace_id, "GetSession names the trace");
    assert_eq!(root_life.parent, spawned(&root).id);
    for (session, parent) in [(&child, &root), (&sibling, &root), (&grandchild, &child)] {
        let span = life(session);
        assert_eq!(span.trace, trace_id, "one trace for the tree");
        assert_eq!(
            span.parent,
            spawned(session).id,
            "a life hangs under its spawn"
        );
        assert_eq!(
            spawned(session).parent,
            life(parent).id,
            "a spawn hangs under its parent's life"
        );
        assert_eq!(span.get("troupe.tree.id"), root_life.get("troupe.tree.id"));
        assert_eq!(span.get("troupe.session.status"), "terminated");
        assert_eq!(span.get("gen_ai.operation.name"), "invoke_agent");
        assert_eq!(span.get("gen_ai.agent.name"), "worker");
        assert_eq!(span.get("troupe.parent_session.id"), **parent);
        assert_eq!(span.get("gen_ai.agent.id"), **session);
        assert_eq!(span.get("troupe.session.id"), **session);
        assert_eq!(span.get("troupe.workspace.id"), "alpha");
        assert_eq!(span.get("troupe.trust_level"), "direct");
        assert!(!span.error, "a terminated session's life is no error");
    }
    assert_eq!(life(&grandchild).get("troupe.depth"), "2");
    assert_eq!(life(&root).get("troupe.end_reason"), "done");
    assert_eq!(life(&child).get("troupe.end_reason"), "cascade");

    // The refusal after the restart is in the tree's trace too.
    let refused = spans
        .iter()
        .find(|s| s.get("troupe.refusal.reason") == "DEPTH_EXCEEDED")
        .unwrap_or_else(|| panic!("no refused spawn: {spans:#?}"));
    assert_eq!(
        (&refused.trace, &refused.parent),
        (&trace_id, &life(&grandchild).id)
    );

    // Two messages; only the one from the sibling's branch is a link.
    let senders: Vec<String> = life(&grandchild)
        .events
        .iter()
        .map(|e| lookup(e, "troupe.message.sender"))
        .collect();
    assert_eq!(
        senders,
        [format!("session:{child}"), format!("session:{sibling}")]
    );
    for event in &life(&grandchild).events {
        assert!(
            lookup(event, "troupe.message.id").starts_with("msg_"),
            "{event:?}"
        );
        assert!(
            !lookup(event, "troupe.message.sequence").is_empty(),
            "{event:?}"
        );
    }
    assert_eq!(
        life(&grandchild).links,
        [(trace_id.clone(), life(&sibling).id.clone())]
    );
}

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

    service
        .operator()
        .await
        .terminate_session(TerminateSessionRequest {
            session_id: root,
            reason: "done".into(),
        })
        .await
        .unwrap();
    let text = scrape(metrics).await;
    assert_eq!(
        sample(&text, "troupe_sessions_active", &active).unwrap_or(0.0),
        0.0,
        "{text}"
    );
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
