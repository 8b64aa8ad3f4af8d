//! A real OTLP/gRPC receiver on loopback (the trace and metrics services of
//! the `opentelemetry-proto` crate), and what it got, in a form tests can
//! compare: ids in hex, attributes as text; and a Prometheus scrape.

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::{
    collector::{
        metrics::v1::{
            ExportMetricsServiceRequest, ExportMetricsServiceResponse,
            metrics_service_server::{MetricsService, MetricsServiceServer},
        },
        trace::v1::{
            ExportTraceServiceRequest, ExportTraceServiceResponse,
            trace_service_server::{TraceService, TraceServiceServer},
        },
    },
    common::v1::{KeyValue, any_value::Value},
    trace::v1::status::StatusCode,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::{Request, Response, Status};

/// Set in the process that runs an exporting test's body, to its
/// receiver's port.
const RECEIVER_PORT: &str = "TROUPE_TEST_OTLP_PORT";

/// Set in the process that runs an exporting test's body, to a file it
/// writes once the body has run: a name that matches no test runs nothing
/// there, which must fail the test rather than pass it.
const RAN_FILE: &str = "TROUPE_TEST_OTLP_RAN";

/// Runs a test whose body must be in a process that exports, configured as
/// an operator configures a server (by the standard variables, which a
/// process reads once). In the test's own process: runs the test binary
/// again for `test` alone (its whole path, `module::name` in a test binary
/// of several files), with `OTEL_EXPORTER_OTLP_ENDPOINT` naming a free port
/// (and exports every 100 ms), and asserts it ran and passed. In that child
/// process: serves a receiver on that port and runs `body` with it, on a
/// multi-threaded runtime.
pub fn exporting_test<F, Fut>(test: &str, body: F)
where
    F: FnOnce(Receiver) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    if let Ok(port) = std::env::var(RECEIVER_PORT) {
        let listener = std::net::TcpListener::bind(format!("127.0.0.1:{port}")).unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move { body(Receiver::serve(listener)).await });
        if let Ok(ran) = std::env::var(RAN_FILE) {
            std::fs::write(ran, test).unwrap();
        }
        return;
    }
    let port = crate::ports::free_addr().port();
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env(RECEIVER_PORT, port.to_string())
        .env(RAN_FILE, &ran)
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        )
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .status()
        .unwrap();
    assert!(
        status.success(),
        "{test} failed in its exporting process: {status}"
    );
    assert!(
        ran.exists(),
        "no test {test} ran in its exporting process: name it by its whole path"
    );
}

/// Keeps every export request it receives.
#[derive(Clone, Default)]
pub struct Receiver {
    traces: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
    metrics: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        self.traces.lock().unwrap().push(request.into_inner());
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Receiver {
    async fn export(
        &self,
        request: Request<ExportMetricsServiceRequest>,
    ) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        self.metrics.lock().unwrap().push(request.into_inner());
        Ok(Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// One span as the receiver got it.
#[derive(Clone, Debug)]
pub struct Received {
    pub name: String,
    pub trace: String,
    pub id: String,
    /// Empty for a root span.
    pub parent: String,
    pub attributes: Vec<(String, String)>,
    /// Its attributes whose value is an array of strings (OpenTelemetry's
    /// `string[]`), element by element; `attributes` has them as debug text.
    pub string_arrays: Vec<(String, Vec<String>)>,
    /// The attributes of the resource that sent it.
    pub resource: Vec<(String, String)>,
    /// The attributes of each event.
    pub events: Vec<Vec<(String, String)>>,
    /// `(trace id, span id)` of each link.
    pub links: Vec<(String, String)>,
    /// Whether its status is an error.
    pub error: bool,
}

impl Received {
    /// The span attribute `key` as text; empty if absent.
    pub fn get(&self, key: &str) -> String {
        lookup(&self.attributes, key)
    }

    /// The span attribute `key` if it is an array of strings; `None` if it
    /// is absent or of another type (a single string too).
    pub fn strings(&self, key: &str) -> Option<&[String]> {
        self.string_arrays
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_slice())
    }
}

impl Receiver {
    /// Serves on a loopback port; returns the receiver and its endpoint.
    pub async fn start() -> (Receiver, String) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        (Receiver::serve(listener), endpoint)
    }

    /// Serves on `listener` (bound before the runtime, for a test that
    /// must name its endpoint first).
    pub fn serve(listener: std::net::TcpListener) -> Receiver {
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let receiver = Receiver::default();
        let server = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver.clone()))
            .add_service(MetricsServiceServer::new(receiver.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
        tokio::spawn(server);
        receiver
    }

    /// Every span received so far, in the order received.
    pub fn spans(&self) -> Vec<Received> {
        let mut out = Vec::new();
        for request in self.traces.lock().unwrap().iter() {
            for resource_spans in &request.resource_spans {
                let resource = resource_spans
                    .resource
                    .as_ref()
                    .map(|r| text(&r.attributes))
                    .unwrap_or_default();
                for scope in &resource_spans.scope_spans {
                    for span in &scope.spans {
                        out.push(Received {
                            name: span.name.clone(),
                            trace: hex(&span.trace_id),
                            id: hex(&span.span_id),
                            parent: hex(&span.parent_span_id),
                            attributes: text(&span.attributes),
                            string_arrays: string_arrays(&span.attributes),
                            resource: resource.clone(),
                            events: span.events.iter().map(|e| text(&e.attributes)).collect(),
                            links: span
                                .links
                                .iter()
                                .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                                .collect(),
                            error: span
                                .status
                                .as_ref()
                                .is_some_and(|status| status.code == StatusCode::Error as i32),
                        });
                    }
                }
            }
        }
        out
    }
}

impl Receiver {
    /// The names of every metric received so far (with repeats).
    pub fn metric_names(&self) -> Vec<String> {
        let mut out = Vec::new();
        for request in self.metrics.lock().unwrap().iter() {
            for resource_metrics in &request.resource_metrics {
                for scope in &resource_metrics.scope_metrics {
                    out.extend(scope.metrics.iter().map(|m| m.name.clone()));
                }
            }
        }
        out
    }
}

/// `GET /metrics` from `addr`: the Prometheus text a scraper would read.
pub async fn scrape(addr: std::net::SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: troupe\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    body.to_owned()
}

/// The value of the sample `name` whose labels include every one of
/// `labels` (`key="value"` pairs), in Prometheus text; `None` if no sample
/// matches.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (series_name, series_labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        let matches = series_name == name
            && labels.iter().all(|(k, v)| {
                series_labels
                    .split(',')
                    .any(|l| l == format!("{k}=\"{v}\""))
            });
        matches.then(|| value.parse().ok()).flatten()
    })
}

/// The first span named `name`; panics, listing them all, if none is.
pub fn named<'a>(spans: &'a [Received], name: &str) -> &'a Received {
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no {name} span: {spans:#?}"))
}

/// Whether `span` is the life span (`invoke_agent <agent>`) of `session`.
pub fn is_life_of(span: &Received, session: &str) -> bool {
    span.name.starts_with("invoke_agent ") && span.get("troupe.session.id") == session
}

/// The life span of `session`; panics, listing the spans, if none is.
pub fn life_of<'a>(spans: &'a [Received], session: &str) -> &'a Received {
    spans
        .iter()
        .find(|s| is_life_of(s, session))
        .unwrap_or_else(|| panic!("no life span of {session}: {spans:#?}"))
}

/// The span of the spawn (`spawn`, or `create_root`) that made `session`;
/// panics, listing the spans, if none is.
pub fn spawn_of<'a>(spans: &'a [Received], session: &str) -> &'a Received {
    spans
        .iter()
        .find(|s| {
            matches!(s.name.as_str(), "spawn" | "create_root")
                && s.get("troupe.session.id") == session
        })
        .unwrap_or_else(|| panic!("no spawn span of {session}: {spans:#?}"))
}

/// The value of `key` in `attributes`; empty if absent.
pub fn lookup(attributes: &[(String, String)], key: &str) -> String {
    attributes
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

fn text(attributes: &[KeyValue]) -> Vec<(String, String)> {
    attributes
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(n)) => n.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

fn string_arrays(attributes: &[KeyValue]) -> Vec<(String, Vec<String>)> {
    attributes
        .iter()
        .filter_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::ArrayValue(array) => {
                let strings = array.values.iter().map(|v| match &v.value {
                    Some(Value::StringValue(s)) => Some(s.clone()),
                    _ => None,
                });
                Some((kv.key.clone(), strings.collect::<Option<Vec<_>>>()?))
            }
            _ => None,
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
