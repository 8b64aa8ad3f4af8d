//! Metrics: the servers' OpenTelemetry instruments, read by an OTLP
//! exporter when the environment names a receiver (as for spans), and by a
//! Prometheus scrape endpoint (`GET /metrics`) when a server is asked to
//! serve one. With neither, no meter provider is installed and every
//! instrument is a no-op.

use std::net::SocketAddr;

use anyhow::Context;
use axum::{extract::State, http::header, response::IntoResponse, routing::get};
use opentelemetry_sdk::{Resource, metrics::SdkMeterProvider};

/// A meter provider reading into the OTLP exporter (`otlp`) and into
/// `registry`; `None` if neither is wanted.
pub(super) fn provider(
    resource: Resource,
    otlp: bool,
    registry: Option<&prometheus::Registry>,
) -> anyhow::Result<Option<SdkMeterProvider>> {
    if !otlp && registry.is_none() {
        return Ok(None);
    }
    let mut builder = SdkMeterProvider::builder().with_resource(resource);
    if otlp {
        let exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .build()
            .context("cannot set up the OTLP metric exporter")?;
        builder = builder.with_periodic_exporter(exporter);
    }
    if let Some(registry) = registry {
        let reader = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .scope_info_enabled(false)
            .build()
            .context("cannot set up the Prometheus exporter")?;
        builder = builder.with_reader(reader);
    }
    Ok(Some(builder.build()))
}

/// Most connections the metrics endpoint holds at once.
const METRICS_CONNECTIONS: usize = 64;

/// Binds `addr` and serves `GET /metrics` from `registry` in the
/// background; returns the address bound.
pub(super) fn serve(
    addr: SocketAddr,
    registry: prometheus::Registry,
) -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("cannot serve metrics on {addr}"))?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let app = axum::Router::new()
        .route("/metrics", get(scrape))
        .with_state(registry);
    // A scraper or two: a few connections, bounded like every listener.
    let gate = troupe_listen::Gate::new(
        "metrics",
        troupe_listen::Bounds {
            max_connections: METRICS_CONNECTIONS,
            max_per_peer: METRICS_CONNECTIONS / 4,
            ..troupe_listen::Bounds::default()
        },
    );
    let listener = troupe_listen::BoundedTcp::new(listener, gate);
    tokio::spawn(async move {
        if let Err(e) = troupe_listen::http::serve(listener, app, std::future::pending()).await {
            tracing::error!(error = %e, "the metrics endpoint stopped");
        }
    });
    Ok(bound)
}

/// One scrape, in the Prometheus text format.
async fn scrape(State(registry): State<prometheus::Registry>) -> impl IntoResponse {
    match prometheus::TextEncoder::new().encode_to_string(&registry.gather()) {
        Ok(text) => ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text).into_response(),
        Err(e) => (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode the metrics: {e}"),
        )
            .into_response(),
    }
}
