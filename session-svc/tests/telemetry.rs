//! `troupe-session` exporting its spans to a real OTLP receiver (the trace
//! service of `opentelemetry-proto`, on loopback), configured only by the
//! standard `OTEL_*` variables; exporting nothing without them; and serving
//! as usual when the receiver is down.

use std::{process::Stdio, time::Duration};

use tokio::process::{Child, Command};
use tonic::Request;
use troupe_proto::session::{
    CreateRootSessionRequest, CreateSessionRequest, GetSessionRequest, IssueSessionTokenRequest,
    SendMessageRequest, TerminateSessionRequest, TrustLevel,
    session_service_client::SessionServiceClient,
};
use troupe_tests::otlp::{Receiver, lookup, named, sample, scrape};

const BINARY: &str = env!("CARGO_BIN_EXE_troupe-session");
const OPERATOR_TOKEN: &str = "telemetry-test-operator-token-0123456789";

/// A `troupe-session` process with its own data directory.
struct Service {
    child: Child,
    endpoint: String,
    dir: tempfile::TempDir,
}

impl Service {
    async fn start(otel: &[(&str, &str)]) -> Service {
        Service::start_with(&[], otel).await
    }

    /// Starts the service with extra flags.
    async fn start_with(flags: &[&str], otel: &[(&str, &str)]) -> Service {
        let dir = tempfile::tempdir().unwrap();
        let agents = dir.path().join("workspaces/Agents");
        std::fs::create_dir_all(&agents).unwrap();
        std::fs::write(
            agents.join("worker.md"),
            "---\nname: worker\ndescription: test agent\ncommand: [\"/bin/cat\"]\n---\n",
        )
        .unwrap();
        Service::start_in(dir, flags, otel)
    }

    /// Starts the service on the data and workspaces of `dir`.
    fn start_in(dir: tempfile::TempDir, flags: &[&str], otel: &[(&str, &str)]) -> Service {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut command = Command::new(BINARY);
        command
            .args(["--listen", &format!("127.0.0.1:{port}"), "--socket", "none"])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--workspaces-dir")
            .arg(dir.path().join("workspaces"))
            .args(flags)
            .env("TROUPE_OPERATOR_TOKEN", OPERATOR_TOKEN)
            .env_remove("OTEL_SERVICE_NAME")
            .env_remove("OTEL_RESOURCE_ATTRIBUTES")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .envs(otel.iter().copied())
            .stdout(Stdio::null())
            .kill_on_drop(true);
        Service {
            child: command.spawn().expect("troupe-session starts"),
            endpoint: format!("http://127.0.0.1:{port}"),
            dir,
        }
    }

    /// Creates a root session as the operator, once the service answers.
    async fn create_root(&self) -> String {
        self.create_root_in(None).await
    }

    /// Asks, as the operator, for a child of `parent`; returns the refusal's code.
    async fn spawn_under(&self, parent: &str) -> tonic::Code {
        let channel = troupe_proto::endpoint::connect(&self.endpoint)
            .await
            .unwrap();
        let auth = troupe_proto::endpoint::Bearer::new(Some(OPERATOR_TOKEN)).unwrap();
        SessionServiceClient::with_interceptor(channel, auth)
            .create_session(CreateSessionRequest {
                parent_session_id: parent.into(),
                agent_name: "worker".into(),
                title: "too deep".into(),
                ..Default::default()
            })
            .await
            .expect_err("refused")
            .code()
    }

    /// Creates a root session as the operator, in the caller's trace
    /// `traceparent` if given; returns its id.
    async fn create_root_in(&self, traceparent: Option<&str>) -> String {
        let mut tries = 0;
        let channel = loop {
            match troupe_proto::endpoint::connect(&self.endpoint).await {
                Ok(channel) => break channel,
                Err(e) => {
                    tries += 1;
                    assert!(tries < 200, "the service did not come up: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        let auth = troupe_proto::endpoint::Bearer::new(Some(OPERATOR_TOKEN)).unwrap();
        let mut request = Request::new(CreateRootSessionRequest {
            workspace_id: "alpha".into(),
            trust_level: TrustLevel::Direct as i32,
            agent_name: "worker".into(),
            title: "traced".into(),
            ..Default::default()
        });
        if let Some(traceparent) = traceparent {
            request
                .metadata_mut()
                .insert("traceparent", traceparent.parse().unwrap());
        }
        SessionServiceClient::with_interceptor(channel, auth)
            .create_root_session(request)
            .await
            .expect("create root")
            .into_inner()
            .session
            .expect("a session")
            .session_id
    }

    /// Stops the service with SIGTERM, as an operator would; true if it
    /// exited cleanly.
    async fn stop(self) -> bool {
        self.stop_keeping_data().await.0
    }

    /// Stops the service; returns whether it exited cleanly, and its data.
    async fn stop_keeping_data(mut self) -> (bool, tempfile::TempDir) {
        let pid = self.child.id().expect("running").to_string();
        let signalled = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .unwrap();
        assert!(signalled.success());
        let clean = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the service stops after SIGTERM")
            .unwrap()
            .success();
        (clean, self.dir)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn spans_reach_an_otlp_receiver_named_by_the_standard_variables() {
    let (receiver, endpoint) = Receiver::start().await;
    let service = Service::start(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test"),
    ])
    .await;
    service.create_root().await;
    assert!(service.stop().await, "clean exit");
    let spans = receiver.spans();
    let created = named(&spans, "create_root");
    assert_eq!(lookup(&created.resource, "service.name"), "troupe-session");
    assert_eq!(lookup(&created.resource, "deployment.environment"), "test");
}

/// A spawn's span names the session it made (Troupe's attributes and the
/// GenAI agent conventions), and a refused spawn's span names the reason.
#[tokio::test(flavor = "multi_thread")]
async fn spawn_spans_carry_the_session_and_the_refusal() {
    let (receiver, endpoint) = Receiver::start().await;
    let service = Service::start_with(
        &["--max-depth", "0"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())],
    )
    .await;
    let root = service.create_root().await;
    assert_eq!(
        service.spawn_under(&root).await,
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

/// A call that carries a `traceparent` is traced inside the caller's trace:
/// the request's span is a child of the caller's span, and the handler's
/// span a child of the request's.
#[tokio::test(flavor = "multi_thread")]
async fn a_callers_traceparent_is_continued() {
    let (receiver, endpoint) = Receiver::start().await;
    let service = Service::start(&[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())]).await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    service
        .create_root_in(Some(&format!("00-{trace}-{caller_span}-01")))
        .await;
    assert!(service.stop().await);
    let spans = receiver.spans();
    let request = named(
        &spans,
        "/troupe.session.v1.SessionService/CreateRootSession",
    );
    assert_eq!(
        (request.trace.as_str(), request.parent.as_str()),
        (trace, caller_span)
    );
    let handler = named(&spans, "create_root");
    assert_eq!(
        (&handler.trace, &handler.parent),
        (&request.trace, &request.id)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_an_endpoint_nothing_is_exported_and_a_dead_receiver_blocks_nothing() {
    // The receiver listens, but nothing names it: it gets nothing.
    let (receiver, _endpoint) = Receiver::start().await;
    let quiet = Service::start(&[("OTEL_SERVICE_NAME", "quiet")]).await;
    quiet.create_root().await;
    assert!(quiet.stop().await);
    assert!(receiver.spans().is_empty());

    // A receiver that is down: calls are served and the stop is clean.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let service = Service::start(&[("OTEL_EXPORTER_OTLP_ENDPOINT", dead.as_str())]).await;
    for _ in 0..3 {
        service.create_root().await;
    }
    assert!(service.stop().await, "clean exit with the receiver down");
}

/// An operator's client of `service`.
async fn operator(
    service: &Service,
) -> SessionServiceClient<
    tonic::service::interceptor::InterceptedService<
        tonic::transport::Channel,
        troupe_proto::endpoint::Bearer,
    >,
> {
    as_bearer(service, OPERATOR_TOKEN).await
}

async fn as_bearer(
    service: &Service,
    token: &str,
) -> SessionServiceClient<
    tonic::service::interceptor::InterceptedService<
        tonic::transport::Channel,
        troupe_proto::endpoint::Bearer,
    >,
> {
    let channel = troupe_proto::endpoint::connect(&service.endpoint)
        .await
        .unwrap();
    let auth = troupe_proto::endpoint::Bearer::new(Some(token)).unwrap();
    SessionServiceClient::with_interceptor(channel, auth)
}

/// Creates, as the operator, a child of `parent`; returns its id.
async fn spawn(service: &Service, parent: &str) -> String {
    operator(service)
        .await
        .create_session(CreateSessionRequest {
            parent_session_id: parent.into(),
            agent_name: "worker".into(),
            ..Default::default()
        })
        .await
        .expect("spawn")
        .into_inner()
        .session
        .expect("a session")
        .session_id
}

/// Sends a message from session `from` to session `to`, with `from`'s token.
async fn send(service: &Service, from: &str, to: &str) {
    let token = operator(service)
        .await
        .issue_session_token(IssueSessionTokenRequest {
            session_id: from.into(),
        })
        .await
        .expect("token")
        .into_inner()
        .session_token;
    as_bearer(service, &token)
        .await
        .send_message(SendMessageRequest {
            session_id: to.into(),
            message: format!("from {from}"),
            ..Default::default()
        })
        .await
        .expect("send");
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
    let service = Service::start_with(&flags, &otel).await;
    let root = service.create_root().await;
    let child = spawn(&service, &root).await;
    let sibling = spawn(&service, &root).await;
    let grandchild = spawn(&service, &child).await;

    // Restarted on the same data: the lives planned before are kept.
    let (clean, dir) = service.stop_keeping_data().await;
    assert!(clean);
    let service = Service::start_in(dir, &flags, &otel);
    service.create_root().await; // waits until it answers
    assert_eq!(
        service.spawn_under(&grandchild).await,
        tonic::Code::ResourceExhausted
    );
    send(&service, &child, &grandchild).await;
    send(&service, &sibling, &grandchild).await;
    let trace_id = operator(&service)
        .await
        .get_session(GetSessionRequest {
            session_id: grandchild.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap()
        .trace_id;
    operator(&service)
        .await
        .terminate_session(TerminateSessionRequest {
            session_id: root.clone(),
            reason: "done".into(),
        })
        .await
        .unwrap();
    assert!(service.stop().await);

    let spans = receiver.spans();
    let life = |session: &str| {
        spans
            .iter()
            .find(|s| s.name == "invoke_agent worker" && s.get("troupe.session.id") == session)
            .unwrap_or_else(|| panic!("no life span of {session}: {spans:#?}"))
    };
    let spawned = |session: &str| {
        spans
            .iter()
            .find(|s| {
                matches!(s.name.as_str(), "spawn" | "create_root")
                    && s.get("troupe.session.id") == session
            })
            .unwrap_or_else(|| panic!("no spawn span of {session}: {spans:#?}"))
    };
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
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let listen = metrics.to_string();
    let service = Service::start_with(
        &["--max-depth", "1", "--metrics-listen", &listen],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
        ],
    )
    .await;
    let root = service.create_root().await;
    let child = spawn(&service, &root).await;
    assert_eq!(
        service.spawn_under(&child).await,
        tonic::Code::ResourceExhausted
    );
    send(&service, &root, &child).await;

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

    operator(&service)
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
