//! A real OTLP/gRPC trace receiver on loopback (the trace service of the
//! `opentelemetry-proto` crate), and the spans it got, in a form tests can
//! compare: ids in hex, attributes as text.

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::{KeyValue, any_value::Value},
};
use tonic::{Request, Response, Status};

/// Keeps every export request it receives.
#[derive(Clone, Default)]
pub struct Receiver(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

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

/// One span as the receiver got it.
#[derive(Clone, Debug)]
pub struct Received {
    pub name: String,
    pub trace: String,
    pub id: String,
    /// Empty for a root span.
    pub parent: String,
    pub attributes: Vec<(String, String)>,
    /// The attributes of the resource that sent it.
    pub resource: Vec<(String, String)>,
    /// The attributes of each event.
    pub events: Vec<Vec<(String, String)>>,
    /// `(trace id, span id)` of each link.
    pub links: Vec<(String, String)>,
}

impl Received {
    /// The span attribute `key` as text; empty if absent.
    pub fn get(&self, key: &str) -> String {
        lookup(&self.attributes, key)
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
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
        tokio::spawn(server);
        receiver
    }

    /// Every span received so far, in the order received.
    pub fn spans(&self) -> Vec<Received> {
        let mut out = Vec::new();
        for request in self.0.lock().unwrap().iter() {
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
                            resource: resource.clone(),
                            events: span.events.iter().map(|e| text(&e.attributes)).collect(),
                            links: span
                                .links
                                .iter()
                                .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                                .collect(),
                        });
                    }
                }
            }
        }
        out
    }
}

/// The first span named `name`; panics, listing them all, if none is.
pub fn named<'a>(spans: &'a [Received], name: &str) -> &'a Received {
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no {name} span: {spans:#?}"))
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
