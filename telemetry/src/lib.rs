//! Telemetry of every Troupe server (the operator's CLI has none): log
//! lines on stderr (filtered by `RUST_LOG`), OpenTelemetry spans and metrics
//! exported over OTLP/gRPC when the standard variables ask for it, and a
//! Prometheus scrape endpoint when a server is asked to serve one:
//!
//! - `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`):
//!   where to send spans. With neither set, nothing is exported and no
//!   OpenTelemetry layer is installed, so tracing costs what logging costs.
//! - `OTEL_TRACES_EXPORTER=none` or `OTEL_SDK_DISABLED=true`: no export even
//!   with an endpoint.
//! - `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`: the resource; the
//!   service name defaults to the binary's (`troupe-session`, ...).
//! - `OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`: the sampler (parent
//!   based, always on, by default).
//!
//! Spans are exported in batches from a thread of their own, at a lower CPU
//! priority than the threads that serve calls: an export that fails (no
//! receiver) is logged and dropped, and never delays a call.
//!
//! [`LifeSpan`] plans spans that last as long as a session does;
//! [`request_span`], [`continue_remote`] and [`traceparent_of`] carry a
//! trace across calls in W3C `traceparent` form; [`set_strings`] sets a
//! string-array attribute, which a `tracing` field cannot carry.

mod life;
mod metrics;

use std::{
    io::IsTerminal,
    net::SocketAddr,
    sync::atomic::{AtomicBool, Ordering},
};

use anyhow::Context;
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_sdk::{
    Resource, metrics::SdkMeterProvider, propagation::TraceContextPropagator,
    trace::SdkTracerProvider,
};
use tonic::codegen::http;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::{
    EnvFilter, Layer, filter::LevelFilter, layer::SubscriberExt, util::SubscriberInitExt,
};

pub use life::{Life, LifeSpan};

/// Whether [`init`] installed span export.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether this process exports spans (as [`init`] decided).
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// What [`init`] installed; [`Telemetry::shutdown`] flushes it.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    meters: Option<SdkMeterProvider>,
    /// Where `GET /metrics` is served, if it is.
    pub metrics_addr: Option<SocketAddr>,
}

/// Installs the global subscriber: logs on stderr (`RUST_LOG`, else
/// `default_filter`), span and metric export if the environment configures
/// it, and a Prometheus scrape endpoint on `metrics_listen` if given.
/// `service` is the service name unless the environment names one.
/// Must be called inside a Tokio runtime (the exporters and the endpoint
/// run on it).
pub fn init(
    service: &'static str,
    default_filter: &str,
    metrics_listen: Option<SocketAddr>,
) -> anyhow::Result<Telemetry> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let var = |name: &str| std::env::var(name).ok();
    let resource = resource(service);
    let registry = metrics_listen.map(|_| prometheus::Registry::new());
    let (traces, metrics) = (
        asks_for_export(&var, "TRACES"),
        asks_for_export(&var, "METRICS"),
    );
    let (provider, meters) = if traces || metrics {
        let registry = registry.clone();
        on_export_thread(move || {
            let provider = traces.then(|| provider(resource.clone())).transpose()?;
            let meters = metrics::provider(resource, metrics, registry.as_ref())?;
            Ok((provider, meters))
        })?
    } else {
        (None, metrics::provider(resource, false, registry.as_ref())?)
    };
    // Spans have a filter of their own: a quiet log (the bridge's `warn`)
    // still exports the calls' spans.
    let spans = provider.as_ref().map(|p| {
        // Without the per-poll bookkeeping (busy and idle times, an
        // OpenTelemetry context attached at every enter, thread and source
        // location attributes): they cost on every request, and nothing
        // here reads them.
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer(service))
            .with_context_activation(false)
            .with_tracked_inactivity(false)
            .with_location(false)
            .with_threads(false)
            .with_filter(LevelFilter::INFO)
    });
    tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(spans)
        .try_init()
        .context("a global subscriber was already installed")?;
    if let Some(provider) = &provider {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        // Planned spans ([`LifeSpan::export`]) start through the global tracer.
        opentelemetry::global::set_tracer_provider(provider.clone());
        EXPORTING.store(true, Ordering::Relaxed);
        tracing::info!(service, "exporting spans over OTLP");
    }

    if let Some(meters) = &meters {
        opentelemetry::global::set_meter_provider(meters.clone());
    }
    let metrics_addr = match (metrics_listen, registry) {
        (Some(addr), Some(registry)) => {
            let bound = metrics::serve(addr, registry)?;
            tracing::info!(%bound, "serving metrics at /metrics");
            Some(bound)
        }
        _ => None,
    };
    Ok(Telemetry {
        provider,
        meters,
        metrics_addr,
    })
}

impl Telemetry {
    /// Exports what is still buffered and stops the exporters. It blocks,
    /// so it runs on a blocking thread while the runtime drives the export.
    pub async fn shutdown(self) {
        let Telemetry {
            provider, meters, ..
        } = self;
        let done = tokio::task::spawn_blocking(move || {
            let spans = provider.map(|p| p.shutdown());
            let metrics = meters.map(|m| m.shutdown());
            (spans, metrics)
        })
        .await;
        if let Ok((spans, metrics)) = done {
            if let Some(Err(e)) = spans {
                tracing::warn!(error = %e, "span export did not finish");
            }
            if let Some(Err(e)) = metrics {
                tracing::warn!(error = %e, "metric export did not finish");
            }
        }
    }
}

/// The span of one incoming gRPC request (for tonic's `Server::trace_fn`),
/// named by its path. It continues the caller's trace when the request's
/// `traceparent` header names one (and spans are exported at all), so an
/// operator's or an agent's trace reaches into the service.
pub fn request_span(request: &http::Request<()>) -> tracing::Span {
    let span = tracing::info_span!("grpc", otel.name = %request.uri().path(), rpc.system = "grpc");
    let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&Headers(request.headers()))
    });
    // Without an OpenTelemetry layer there is nothing to parent, and nothing lost.
    let _ = span.set_parent(parent);
    span
}

/// Puts `span` (not started yet) under the remote span that the W3C
/// `traceparent` text names. Nothing happens without span export, or for
/// text that names no span.
pub fn continue_remote(span: &tracing::Span, traceparent: &str) {
    if let Some(remote) = remote_span(traceparent) {
        continue_span(span, &remote);
    }
}

/// Puts `span` (not started yet) under the `remote` span.
pub fn continue_span(span: &tracing::Span, remote: &opentelemetry::trace::SpanContext) {
    let parent = opentelemetry::Context::new().with_remote_span_context(remote.clone());
    // Fails only without an OpenTelemetry layer: nothing to parent.
    let _ = span.set_parent(parent);
}

/// The span a W3C `traceparent` names, as the propagator reads it; `None`
/// for text that names no span, or without span export.
pub fn remote_span(traceparent: &str) -> Option<opentelemetry::trace::SpanContext> {
    let cx = opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&Traceparent(traceparent))
    });
    let remote = cx.span().span_context().clone();
    remote.is_valid().then_some(remote)
}

/// Sets the attribute `key` of `span` to an array of strings, which a
/// `tracing` field cannot carry (it records one value: a string, a
/// number): OpenTelemetry's `string[]`, as GenAI's
/// `gen_ai.response.finish_reasons`. Nothing happens without span export.
pub fn set_strings(span: &tracing::Span, key: &'static str, values: &[String]) {
    let values = values
        .iter()
        .map(|v| opentelemetry::StringValue::from(v.clone()))
        .collect();
    span.set_attribute(
        key,
        opentelemetry::Value::Array(opentelemetry::Array::String(values)),
    );
}

/// The W3C `traceparent` of `span`, for the calls made inside it; `None`
/// when it is not traced (as without span export).
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    let span = cx.span();
    let context = span.span_context();
    context.is_valid().then(|| traceparent(context))
}

/// The W3C `traceparent` text of a span context.
fn traceparent(context: &opentelemetry::trace::SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        context.trace_id(),
        context.span_id(),
        context.trace_flags().to_u8()
    )
}

/// One `traceparent` value, as the propagator reads it.
struct Traceparent<'a>(&'a str);

impl opentelemetry::propagation::Extractor for Traceparent<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        (key == "traceparent").then_some(self.0)
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent"]
    }
}

/// The headers of a request, as the propagator reads them.
struct Headers<'a>(&'a http::HeaderMap);

impl opentelemetry::propagation::Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Runs `build` on the export thread, started here, and returns what it
/// built. The OTLP exporters must be built there: their gRPC channels run
/// on the runtime of the thread they are built on, so the encoding and
/// sending of each batch happens on that thread's runtime, not on the
/// workers that serve calls. The thread runs at a lower CPU priority
/// ([`EXPORT_NICENESS`] nicer), and so do the threads the SDK starts from it (the
/// span batcher, the metric reader), since Linux threads inherit it: when
/// the cores are busy, calls go first and telemetry waits.
fn on_export_thread<T: Send + 'static>(
    build: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    let (built_tx, built) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("troupe-export".to_owned())
        .spawn(move || {
            lower_priority();
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = built_tx
                        .send(Err(anyhow::Error::new(e)
                            .context("cannot start the export thread's runtime")));
                    return;
                }
            };
            let result = {
                let _inside = runtime.enter();
                build()
            };
            let failed = result.is_err();
            let _ = built_tx.send(result);
            if !failed {
                // The exporters' channels live as long as the process.
                runtime.block_on(std::future::pending::<()>());
            }
        })
        .context("cannot start the export thread")?;
    built
        .recv()
        .context("the export thread stopped before it was ready")?
}

/// How much nicer than the serving threads the export threads are.
const EXPORT_NICENESS: i32 = 10;

/// Lowers the calling thread's CPU priority by [`EXPORT_NICENESS`], up to
/// the lowest there is (on Linux, `getpriority` and `setpriority` on "this
/// process" act on the calling thread only). Best effort: without it,
/// export competes with calls as an equal.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getpriority_process, setpriority_process};
        /// The nicest value Linux has.
        const NICEST: i32 = 19;
        let lowered = getpriority_process(None)
            .and_then(|now| setpriority_process(None, (now + EXPORT_NICENESS).min(NICEST)));
        if let Err(e) = lowered {
            tracing::debug!(error = %e, "the export thread keeps the serving priority");
        }
    }
}

/// Whether the environment (read through `var`) asks for the export of
/// `signal` (`TRACES` or `METRICS`): an OTLP endpoint for it, and neither
/// the SDK nor that signal's exporter turned off.
fn asks_for_export(var: &dyn Fn(&str) -> Option<String>, signal: &str) -> bool {
    let set = |name: &str| var(name).is_some_and(|v| !v.trim().is_empty());
    let endpoint =
        set("OTEL_EXPORTER_OTLP_ENDPOINT") || set(&format!("OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"));
    let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || var(&format!("OTEL_{signal}_EXPORTER"))
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
    endpoint && !disabled
}

fn provider(resource: Resource) -> anyhow::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
        .context("cannot set up the OTLP span exporter")?;
    Ok(SdkTracerProvider::builder()
        .with_resource(resource)
        .with_id_generator(life::Ids::default())
        .with_batch_exporter(exporter)
        .build())
}

/// The resource the environment describes, named `service` unless
/// `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` names it.
fn resource(service: &'static str) -> Resource {
    let detected = Resource::builder().build();
    let named = detected
        .get(&opentelemetry::Key::new("service.name"))
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    if named {
        detected
    } else {
        Resource::builder().with_service_name(service).build()
    }
}

#[cfg(test)]
mod tests {
    use super::asks_for_export;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn a_signal_is_exported_only_when_an_endpoint_is_set_and_export_is_not_off() {
        let exporting = |vars: &[(&str, &str)], signal| asks_for_export(&env(vars), signal);
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317");
        let traces = (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:4317",
        );
        assert!(!exporting(&[], "TRACES"));
        assert!(!exporting(
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")],
            "TRACES"
        ));
        assert!(exporting(&[endpoint], "TRACES"));
        assert!(exporting(&[endpoint], "METRICS"));
        assert!(exporting(&[traces], "TRACES"));
        assert!(
            !exporting(&[traces], "METRICS"),
            "a traces endpoint is not a metrics one"
        );
        assert!(!exporting(
            &[endpoint, ("OTEL_TRACES_EXPORTER", "none")],
            "TRACES"
        ));
        assert!(exporting(
            &[endpoint, ("OTEL_TRACES_EXPORTER", "none")],
            "METRICS"
        ));
        assert!(!exporting(
            &[endpoint, ("OTEL_METRICS_EXPORTER", "none")],
            "METRICS"
        ));
        assert!(!exporting(
            &[endpoint, ("OTEL_SDK_DISABLED", "TRUE")],
            "TRACES"
        ));
        assert!(!exporting(
            &[endpoint, ("OTEL_SDK_DISABLED", "true")],
            "METRICS"
        ));
        assert!(exporting(
            &[endpoint, ("OTEL_SDK_DISABLED", "false")],
            "TRACES"
        ));
        assert!(exporting(
            &[endpoint, ("OTEL_TRACES_EXPORTER", "otlp")],
            "TRACES"
        ));
    }
}
