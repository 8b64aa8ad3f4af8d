//! `troupe-session` exporting its spans to a real OTLP receiver (the trace
//! service of `opentelemetry-proto`, on loopback), configured only by the
//! standard `OTEL_*` variables; exporting nothing without them; and serving
//! as usual when the receiver is down.

use std::{
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::{KeyValue, any_value::Value},
};
use tokio::process::{Child, Command};
use tonic::{Request, Response, Status};
use troupe_proto::session::{
    CreateRootSessionRequest, CreateSessionRequest, TrustLevel,
    session_service_client::SessionServiceClient,
};

const BINARY: &str = env!("CARGO_BIN_EXE_troupe-session");
const OPERATOR_TOKEN: &str = "telemetry-test-operator-token-0123456789";

/// Every export request received.
#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Receiver {
    /// Serves on a loopback port; returns the receiver and its endpoint.
    async fn start() -> (Receiver, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let receiver = Receiver::default();
        let server = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
        tokio::spawn(server);
        (receiver, endpoint)
    }

    /// `(service.name, the resource attribute named, span name)` of every span received.
    fn spans(&self, attribute: &str) -> Vec<(String, String, String)> {
        let text = |attrs: &[KeyValue], key: &str| {
            attrs
                .iter()
                .find(|kv| kv.key == key)
                .and_then(|kv| kv.value.as_ref())
                .and_then(|v| match &v.value {
                    Some(Value::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default()
        };
        let mut out = Vec::new();
        for request in self.0.lock().unwrap().iter() {
            for resource_spans in &request.resource_spans {
                let attrs = resource_spans
                    .resource
                    .as_ref()
                    .map(|r| r.attributes.as_slice())
                    .unwrap_or_default();
                for scope in &resource_spans.scope_spans {
                    for span in &scope.spans {
                        out.push((
                            text(attrs, "service.name"),
                            text(attrs, attribute),
                            span.name.clone(),
                        ));
                    }
                }
            }
        }
        out
    }
}

/// The spans received, by name: `(trace id, span id, parent span id)`, in hex.
fn ids(receiver: &Receiver) -> Vec<(String, String, String, String)> {
    let mut out = Vec::new();
    for request in receiver.0.lock().unwrap().iter() {
        for resource_spans in &request.resource_spans {
            for scope in &resource_spans.scope_spans {
                for span in &scope.spans {
                    out.push((
                        span.name.clone(),
                        hex(&span.trace_id),
                        hex(&span.span_id),
                        hex(&span.parent_span_id),
                    ));
                }
            }
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A `troupe-session` process with its own data directory.
struct Service {
    child: Child,
    endpoint: String,
    _dir: tempfile::TempDir,
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
            _dir: dir,
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
    async fn stop(mut self) -> bool {
        let pid = self.child.id().expect("running").to_string();
        let signalled = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .unwrap();
        assert!(signalled.success());
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the service stops after SIGTERM")
            .unwrap()
            .success()
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
    let spans = receiver.spans("deployment.environment");
    assert!(
        spans.contains(&(
            "troupe-session".to_owned(),
            "test".to_owned(),
            "create_root".to_owned()
        )),
        "{spans:?}"
    );
}

/// The string attributes of every span named `name`.
fn attributes(receiver: &Receiver, name: &str) -> Vec<Vec<(String, String)>> {
    let mut out = Vec::new();
    for request in receiver.0.lock().unwrap().iter() {
        for resource_spans in &request.resource_spans {
            for scope in &resource_spans.scope_spans {
                for span in scope.spans.iter().filter(|s| s.name == name) {
                    out.push(
                        span.attributes
                            .iter()
                            .map(|kv| {
                                let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                                    Some(Value::StringValue(s)) => s.clone(),
                                    Some(Value::IntValue(n)) => n.to_string(),
                                    other => format!("{other:?}"),
                                };
                                (kv.key.clone(), value)
                            })
                            .collect(),
                    );
                }
            }
        }
    }
    out
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

    let created = attributes(&receiver, "create_root");
    let created = created
        .first()
        .unwrap_or_else(|| panic!("no create_root span"));
    let get = |attrs: &[(String, String)], key: &str| {
        attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(get(created, "troupe.session.id"), root);
    assert_eq!(get(created, "gen_ai.agent.id"), root);
    assert_eq!(get(created, "gen_ai.agent.name"), "worker");
    assert_eq!(get(created, "gen_ai.operation.name"), "create_agent");
    assert_eq!(get(created, "troupe.workspace.id"), "alpha");
    assert_eq!(get(created, "troupe.trust_level"), "direct");
    assert_eq!(get(created, "troupe.depth"), "0");
    assert!(get(created, "troupe.tree.id").starts_with("tree_"));

    let refused = attributes(&receiver, "spawn");
    let refused = refused.first().unwrap_or_else(|| panic!("no spawn span"));
    assert_eq!(get(refused, "troupe.refusal.reason"), "DEPTH_EXCEEDED");
    assert_eq!(get(refused, "troupe.session.id"), "");
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
    let spans = ids(&receiver);
    let request = spans
        .iter()
        .find(|(name, ..)| name == "/troupe.session.v1.SessionService/CreateRootSession")
        .unwrap_or_else(|| panic!("{spans:?}"));
    assert_eq!(
        (&request.1, &request.3),
        (&trace.to_owned(), &caller_span.to_owned())
    );
    let handler = spans
        .iter()
        .find(|(name, ..)| name == "create_root")
        .unwrap_or_else(|| panic!("{spans:?}"));
    assert_eq!((&handler.1, &handler.3), (&trace.to_owned(), &request.2));
}

#[tokio::test(flavor = "multi_thread")]
async fn without_an_endpoint_nothing_is_exported_and_a_dead_receiver_blocks_nothing() {
    // The receiver listens, but nothing names it: it gets nothing.
    let (receiver, _endpoint) = Receiver::start().await;
    let quiet = Service::start(&[("OTEL_SERVICE_NAME", "quiet")]).await;
    quiet.create_root().await;
    assert!(quiet.stop().await);
    assert!(receiver.spans("service.name").is_empty());

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
