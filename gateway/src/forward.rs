//! The upstream call: the agent's request sent on with the provider's key
//! in place of the agent's, and its answer relayed back, a stream as it
//! comes ([`Relay`]). Every way a call ends settles its reservation exactly once
//! ([`Settlement`]): with the provider's usage when it answered, with what
//! it had reported when it broke off, with its final usage or worst case
//! when the client hung up, with its worst case when its usage cannot be
//! read, with nothing when it was never reached. Each step has a deadline ([`Timeouts`]), so
//! nothing waits forever. What comes back is bounded and scrubbed of the
//! provider's key: an error answer up to [`MAX_ERROR_BYTES`], a JSON answer
//! up to [`MAX_ANSWER_BYTES`], the headers by allowlist
//! ([`super::headers`]).
//!
//! Each provider has one pooled [`Client`] (hyper-util's, HTTP/1.1, over
//! TLS with hyper-rustls for `https://`).

use std::time::Duration;

use axum::{
    body::{Body, Bytes},
    http::{HeaderMap, Request, StatusCode, header},
    response::Response,
};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{
    client::legacy::{Client as HyperClient, connect::HttpConnector},
    rt::TokioExecutor,
};

use super::{
    config::{Provider, Timeouts},
    headers::{relayed_headers, upstream_headers},
    prepare::Route,
    relay::Relay,
    scrub::Scrubber,
    settle::Settlement,
    shape::{Api, ApiError, Kind},
    tls::{self, ExtraRoots},
    usage::{self, Reported},
};
use troupe_domain::model::{CallOutcome, Charge, Price, Reservation, TokenUsage};
use troupe_store::Store;

/// Largest error answer of a provider relayed; a longer one is not read
/// past it, and the agent gets the gateway's own error with its status.
pub const MAX_ERROR_BYTES: usize = 64 << 10;

/// Largest JSON answer read (every completion of a call at its bound fits).
pub const MAX_ANSWER_BYTES: usize = 64 << 20;

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
    pub route: Route,
    pub api: Api,
    /// The provider's key out of its answers.
    pub scrubber: Scrubber,
    pub provider: Provider,
    pub model: String,
    pub price: Price,
    pub timeouts: Timeouts,
    /// The route's path, and Anthropic's `?beta=true` if the agent sent it.
    pub path_and_query: String,
    /// The agent's headers: only an allowlist of them goes on.
    pub headers: HeaderMap,
    pub body: Bytes,
    pub worst: Charge,
    /// The worst case as tokens: the body's bytes as input, every
    /// completion's bound as output.
    pub worst_tokens: TokenUsage,
    pub session_id: String,
    pub workspace_id: String,
    pub agent: String,
    /// The session's life span: the model call's span is its child.
    pub life: Option<troupe_telemetry::LifeSpan>,
    /// The request's bytes, counted in flight until the call ends: held
    /// for its drop, never read.
    pub _held: Option<super::body::Held>,
}

fn upstream_request(call: &Call) -> Result<Request<Full<Bytes>>, ApiError> {
    let uri = format!("{}{}", call.provider.base_url, call.path_and_query);
    let mut builder = Request::post(uri);
    *builder.headers_mut().expect("a fresh request") =
        upstream_headers(&call.headers, &call.provider)?;
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

/// How reading a whole answer failed.
enum ReadError {
    /// It broke off or stalled.
    Fault(ApiError),
    /// It was longer than the bound: not read past it.
    TooLong,
}

/// Reads a whole answer body, each piece within `idle`, up to `limit`
/// bytes.
async fn read_all(
    mut body: Incoming,
    idle: Duration,
    provider: &str,
    limit: usize,
) -> Result<Bytes, ReadError> {
    let mut all = Vec::new();
    loop {
        match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => {
                return Err(ReadError::Fault(ApiError::new(
                    Kind::Timeout,
                    format!(
                        "provider {provider} stopped answering for {} ms",
                        idle.as_millis()
                    ),
                )));
            }
            Ok(None) => return Ok(Bytes::from(all)),
            Ok(Some(Err(e))) => {
                return Err(ReadError::Fault(ApiError::new(
                    Kind::Upstream,
                    format!("provider {provider}'s answer broke off: {e}"),
                )));
            }
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    if all.len() + data.len() > limit {
                        return Err(ReadError::TooLong);
                    }
                    all.extend_from_slice(&data);
                }
            }
        }
    }
}

fn relayed_head(
    status: StatusCode,
    headers: &HeaderMap,
    scrubber: &Scrubber,
) -> axum::http::response::Builder {
    let mut builder = Response::builder().status(status);
    if let Some(out) = builder.headers_mut() {
        *out = relayed_headers(headers, scrubber);
    }
    builder
}

/// An answer read whole, relayed with the key scrubbed from it.
fn relayed(status: StatusCode, headers: &HeaderMap, scrubber: &Scrubber, body: &Bytes) -> Response {
    let body = match scrubber.scrub(body) {
        std::borrow::Cow::Borrowed(_) => body.clone(),
        std::borrow::Cow::Owned(scrubbed) => {
            tracing::warn!("a provider's answer held its key: scrubbed");
            Bytes::from(scrubbed)
        }
    };
    relayed_head(status, headers, scrubber)
        .body(Body::from(body))
        .unwrap_or_default()
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
    if status.is_success() && event_stream && !call.route.counts_tokens() {
        let relay = Relay::new(body, settlement, status, &call);
        return relayed_head(status, &parts.headers, &call.scrubber)
            .body(Body::new(relay))
            .unwrap_or_default();
    }
    let limit = if status.is_success() {
        MAX_ANSWER_BYTES
    } else {
        MAX_ERROR_BYTES
    };
    let name = &call.provider.name;
    let bytes = match read_all(body, call.timeouts.idle, name, limit).await {
        Ok(bytes) => bytes,
        Err(ReadError::Fault(e)) => {
            // What it had generated is unknown: its worst case, if it
            // said it was answering.
            let reported = match status.is_success() {
                true => Reported::unknown(),
                false => Reported::default(),
            };
            settlement
                .settle(&reported, CallOutcome::Failed, Some(status))
                .await;
            return e.response(call.api);
        }
        Err(ReadError::TooLong) => {
            let reported = match status.is_success() {
                true => Reported::unknown(),
                false => Reported::default(),
            };
            settlement
                .settle(&reported, CallOutcome::Failed, Some(status))
                .await;
            let (status, bound) = match status.is_success() {
                true => (StatusCode::BAD_GATEWAY, MAX_ANSWER_BYTES),
                false => (status, MAX_ERROR_BYTES),
            };
            let e = ApiError::new(
                Kind::Upstream,
                format!(
                    "provider {name} answered {} with a body over {} KiB: not relayed",
                    parts.status.as_u16(),
                    bound >> 10
                ),
            );
            let mut response = e.response(call.api);
            *response.status_mut() = status;
            return response;
        }
    };
    if !status.is_success() {
        // The provider's own error, in its own shape, scrubbed.
        settlement
            .settle(&Reported::default(), CallOutcome::Failed, Some(status))
            .await;
        return relayed(status, &parts.headers, &call.scrubber, &bytes);
    }
    if call.route.counts_tokens() {
        // It generates nothing: a call of no tokens.
        settlement
            .settle(&Reported::default(), CallOutcome::Ok, Some(status))
            .await;
        return relayed(status, &parts.headers, &call.scrubber, &bytes);
    }
    match usage::from_json(call.api, &bytes) {
        Some(reported) => {
            settlement
                .settle(&reported, CallOutcome::Ok, Some(status))
                .await;
            relayed(status, &parts.headers, &call.scrubber, &bytes)
        }
        None => {
            // It answered, so it charged: what is unknown is charged in full.
            settlement
                .settle(&Reported::unknown(), CallOutcome::Failed, Some(status))
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
