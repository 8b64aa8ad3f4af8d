//! The upstream call: the agent's request sent on with the provider's key
//! in place of the agent's, and its answer relayed back, a stream as it
//! comes ([`Relay`]). Every way a call ends settles its reservation exactly once
//! ([`Settlement`]): with the provider's usage when it answered, with what
//! it had reported when it broke off or the client hung up, with nothing
//! when it was never reached. Each step has a deadline ([`Timeouts`]), so
//! nothing waits forever.

use std::time::{Duration, Instant};

use axum::{
    body::{Body, Bytes},
    http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode, header},
    response::Response,
};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{
    client::legacy::{Client as HyperClient, connect::HttpConnector},
    rt::TokioExecutor,
};
use tracing::field::Empty;

use super::{
    config::{Provider, ProviderKind, Timeouts},
    relay::Relay,
    shape::{Api, ApiError, Kind},
    tls::{self, ExtraRoots},
    usage::{self, Reported},
};
use crate::{
    metrics,
    model::{CallOutcome, Charge, Cost, ModelCall, Price, Reservation, now_ms},
    store::Store,
};

/// A provider's HTTP client: HTTP/1.1 over TLS (`https://`) or plain
/// (`http://`), pooled.
pub type Client = HyperClient<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Builds a provider's client: `connect` bounds each new connection (TCP;
/// the handshake is within the call's first-byte deadline), and its
/// certificate must chain to the Mozilla roots or to `extra`.
pub fn client(connect: Duration, extra: &ExtraRoots) -> Client {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(connect));
    http.set_nodelay(true);
    // The TLS layer takes `https://`; this one must let it through.
    http.enforce_http(false);
    let https = HttpsConnectorBuilder::new()
        .with_tls_config(tls::client_config(extra))
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    HyperClient::builder(TokioExecutor::new()).build(https)
}

/// A checked call, ready to go upstream.
#[derive(Debug)]
pub struct Call {
    pub api: Api,
    pub provider: Provider,
    pub model: String,
    pub price: Price,
    pub timeouts: Timeouts,
    /// As the agent sent it (`/v1/messages?beta=true`).
    pub path_and_query: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub worst: Charge,
    pub session_id: String,
    pub workspace_id: String,
    pub agent: String,
    /// The session's life span: the model call's span is its child.
    pub life: Option<troupe_telemetry::LifeSpan>,
}

/// Request headers that are the connection's or the agent's own, never
/// sent on: hop-by-hop headers, the agent's key, and `accept-encoding` (the
/// gateway reads the answer, so it asks for it uncompressed).
const DROPPED_REQUEST: [&str; 12] = [
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "accept-encoding",
    "cookie",
];
/// Answer headers that are the connection's, never relayed.
const DROPPED_RESPONSE: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

fn upstream_request(call: &Call) -> Result<Request<Full<Bytes>>, ApiError> {
    let uri = format!("{}{}", call.provider.base_url, call.path_and_query);
    let mut builder = Request::post(uri);
    let headers = builder.headers_mut().expect("a fresh request");
    for (name, value) in &call.headers {
        let n = name.as_str();
        if DROPPED_REQUEST.contains(&n) || n == "x-api-key" || n == "authorization" {
            continue;
        }
        headers.append(name.clone(), value.clone());
    }
    let key = call.provider.key.expose();
    let (name, value) = match call.provider.kind {
        ProviderKind::Anthropic => ("x-api-key", key.to_owned()),
        ProviderKind::Openai => ("authorization", format!("Bearer {key}")),
    };
    let mut value = HeaderValue::from_str(&value)
        .map_err(|_| ApiError::new(Kind::Internal, "the provider's key is not a header value"))?;
    value.set_sensitive(true);
    headers.insert(HeaderName::from_static(name), value);
    if !headers.contains_key(header::CONTENT_TYPE) {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    builder
        .body(Full::new(call.body.clone()))
        .map_err(|_| ApiError::new(Kind::Invalid, "the request's path cannot be sent on"))
}

/// Sends the call and waits for the answer's head.
async fn send(client: &Client, call: &Call) -> Result<hyper::Response<Incoming>, ApiError> {
    let request = upstream_request(call)?;
    let name = &call.provider.name;
    let wait = call.timeouts.first_byte;
    match tokio::time::timeout(wait, client.request(request)).await {
        Err(_) => Err(ApiError::new(
            Kind::Timeout,
            format!(
                "provider {name} did not answer within {} ms",
                wait.as_millis()
            ),
        )),
        Ok(Err(e)) => {
            // A certificate that does not verify shows here, in the cause.
            let mut cause = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                cause = format!("{cause}: {s}");
                source = s.source();
            }
            tracing::warn!(provider = %name, error = %cause, "cannot reach the provider");
            Err(ApiError::new(
                Kind::Upstream,
                format!("cannot reach provider {name}: {cause}"),
            ))
        }
        Ok(Ok(response)) => Ok(response),
    }
}

/// Reads a whole answer body, each piece within `idle`.
async fn read_all(mut body: Incoming, idle: Duration, provider: &str) -> Result<Bytes, ApiError> {
    let mut all = Vec::new();
    loop {
        match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => {
                return Err(ApiError::new(
                    Kind::Timeout,
                    format!(
                        "provider {provider} stopped answering for {} ms",
                        idle.as_millis()
                    ),
                ));
            }
            Ok(None) => return Ok(Bytes::from(all)),
            Ok(Some(Err(e))) => {
                return Err(ApiError::new(
                    Kind::Upstream,
                    format!("provider {provider}'s answer broke off: {e}"),
                ));
            }
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    all.extend_from_slice(&data);
                }
            }
        }
    }
}

fn relayed_head(status: StatusCode, headers: &HeaderMap) -> axum::http::response::Builder {
    let mut builder = Response::builder().status(status);
    for (name, value) in headers {
        if !DROPPED_RESPONSE.contains(&name.as_str()) {
            builder = builder.header(name, value);
        }
    }
    builder
}

/// `count_tokens`: forwarded as it is, not metered (it costs nothing).
pub async fn count_tokens(client: Client, call: Call) -> Response {
    let response = match send(&client, &call).await {
        Ok(r) => r,
        Err(e) => return e.response(call.api),
    };
    let (parts, body) = response.into_parts();
    match read_all(body, call.timeouts.idle, &call.provider.name).await {
        Ok(bytes) => relayed_head(parts.status, &parts.headers)
            .body(Body::from(bytes))
            .unwrap_or_default(),
        Err(e) => e.response(call.api),
    }
}

/// Makes the call with its reservation held, and settles it.
pub async fn run<S: Store + 'static>(
    client: Client,
    store: S,
    call: Call,
    reservation: Reservation,
) -> Response {
    let mut settlement = Settlement::new(store, &call, reservation);
    let response = match send(&client, &call).await {
        Ok(r) => r,
        Err(e) => {
            settlement
                .settle(&Reported::default(), CallOutcome::Released, None)
                .await;
            return e.response(call.api);
        }
    };
    let (parts, body) = response.into_parts();
    let status = parts.status;
    let event_stream = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if status.is_success() && event_stream {
        let relay = Relay::new(
            body,
            settlement,
            status,
            call.api,
            call.timeouts.idle,
            call.provider.name.clone(),
        );
        return relayed_head(status, &parts.headers)
            .body(Body::new(relay))
            .unwrap_or_default();
    }
    let bytes = match read_all(body, call.timeouts.idle, &call.provider.name).await {
        Ok(bytes) => bytes,
        Err(e) => {
            settlement
                .settle(&Reported::default(), CallOutcome::Failed, Some(status))
                .await;
            return e.response(call.api);
        }
    };
    if !status.is_success() {
        // The provider's own error, in its own shape: relayed as it is.
        settlement
            .settle(&Reported::default(), CallOutcome::Failed, Some(status))
            .await;
        return relayed_head(status, &parts.headers)
            .body(Body::from(bytes))
            .unwrap_or_default();
    }
    match usage::from_json(call.api, &bytes) {
        Some(reported) => {
            settlement
                .settle(&reported, CallOutcome::Ok, Some(status))
                .await;
            relayed_head(status, &parts.headers)
                .body(Body::from(bytes))
                .unwrap_or_default()
        }
        None => {
            settlement
                .settle(&Reported::default(), CallOutcome::Failed, Some(status))
                .await;
            ApiError::new(
                Kind::Upstream,
                format!(
                    "provider {}'s answer could not be read (no usage in it)",
                    call.provider.name
                ),
            )
            .response(call.api)
        }
    }
}

/// A call's reservation, settled exactly once: by [`Settlement::settle`],
/// or, if the call's task ends otherwise, released when dropped.
pub(super) struct Settlement<S: Store + 'static> {
    store: S,
    reservation: Option<Reservation>,
    provider: String,
    model: String,
    price: Price,
    workspace_id: String,
    agent: String,
    started_ms: i64,
    started: Instant,
    span: tracing::Span,
}

impl<S: Store + 'static> Settlement<S> {
    fn new(store: S, call: &Call, reservation: Reservation) -> Settlement<S> {
        let operation = match call.api {
            Api::Anthropic | Api::Openai => "chat",
        };
        let span = tracing::info_span!(
            "model_call",
            otel.name = %format!("{operation} {}", call.model),
            otel.kind = "client",
            gen_ai.operation.name = operation,
            gen_ai.provider.name = call.provider.kind.as_str(),
            gen_ai.request.model = %call.model,
            gen_ai.usage.input_tokens = Empty,
            gen_ai.usage.output_tokens = Empty,
            gen_ai.response.finish_reasons = Empty,
            session_id = %call.session_id,
            workspace_id = %call.workspace_id,
            outcome = Empty,
        );
        if let Some(life) = &call.life {
            life.adopt(&span, None);
        }
        Settlement {
            store,
            reservation: Some(reservation),
            provider: call.provider.name.clone(),
            model: call.model.clone(),
            price: call.price,
            workspace_id: call.workspace_id.clone(),
            agent: call.agent.clone(),
            started_ms: now_ms(),
            started: Instant::now(),
            span,
        }
    }

    fn record(
        &self,
        reported: &Reported,
        outcome: CallOutcome,
        status: Option<StatusCode>,
    ) -> ModelCall {
        let tokens = reported.tokens;
        ModelCall {
            provider: self.provider.clone(),
            model: self.model.clone(),
            tokens,
            cost: self.price.cost(&tokens).unwrap_or(Cost(i64::MAX as u64)),
            started_at_ms: self.started_ms,
            duration_ms: self.started.elapsed().as_millis().min(u64::MAX as u128) as u64,
            outcome,
            http_status: status.map(|s| s.as_u16()),
        }
    }

    pub(super) async fn settle(
        &mut self,
        reported: &Reported,
        outcome: CallOutcome,
        status: Option<StatusCode>,
    ) {
        let Some(reservation) = self.reservation.take() else {
            return;
        };
        let call = self.record(reported, outcome, status);
        self.span
            .record("gen_ai.usage.input_tokens", call.tokens.input);
        self.span
            .record("gen_ai.usage.output_tokens", call.tokens.output);
        troupe_telemetry::set_strings(
            &self.span,
            "gen_ai.response.finish_reasons",
            &reported.finish_reasons,
        );
        self.span.record("outcome", outcome.as_str());
        metrics::model_call(&self.workspace_id, &self.agent, &call);
        settle(&self.store, &reservation, &call).await;
    }
}

async fn settle<S: Store>(store: &S, reservation: &Reservation, call: &ModelCall) {
    if let Err(e) = store.settle(reservation, call).await {
        // The upkeep releases the reservation once it is stale.
        tracing::error!(error = %e, reservation = %reservation.id, "cannot settle a model call");
    }
}

impl<S: Store + 'static> Drop for Settlement<S> {
    fn drop(&mut self) {
        let Some(reservation) = self.reservation.take() else {
            return;
        };
        let call = self.record(&Reported::default(), CallOutcome::Released, None);
        let store = self.store.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { settle(&store, &reservation, &call).await });
        }
    }
}
