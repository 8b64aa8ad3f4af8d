//! The shared streamable HTTP endpoint: rmcp's `StreamableHttpService`
//! mounted at `/mcp` in axum. Every MCP session on it gets its own
//! [`Bridge`], acting per request with the request's bearer token
//! ([`crate::caller`]), so one endpoint serves every session of a machine.

use std::{future::Future, sync::Arc, time::Duration};

use anyhow::Context;
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{HttpArgs, backend::Backend, caller::Identity, tools::Bridge};

/// The path the MCP endpoint is served on.
pub const MCP_PATH: &str = "/mcp";

/// Builds the axum router: `/mcp` and `/healthz`.
pub fn router(args: &HttpArgs, cancel: CancellationToken) -> axum::Router {
    let backend = Arc::new(Backend::new(args.endpoint.join(",")));
    let mut config = StreamableHttpServerConfig::default()
        .with_cancellation_token(cancel)
        // The same limit as a stdio line; a larger body is answered 413.
        .with_max_request_body_bytes(crate::stdio::MAX_LINE_BYTES);
    if !args.allowed_hosts.is_empty() {
        let mut hosts = config.allowed_hosts.clone();
        hosts.extend(args.allowed_hosts.iter().cloned());
        config = config.with_allowed_hosts(hosts);
    }
    let service: StreamableHttpService<Bridge, LocalSessionManager> = StreamableHttpService::new(
        move || Ok(Bridge::new(backend.clone(), Identity::PerRequest)),
        Default::default(),
        config,
    );
    axum::Router::new()
        .nest_service(MCP_PATH, service)
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
}

/// Serves on `listener` until `shutdown` completes, then ends the open MCP
/// sessions and returns once the requests still open have finished, or
/// the drain time (`--shutdown-drain-ms`) has passed.
pub async fn serve(
    listener: TcpListener,
    args: &HttpArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let cancel = CancellationToken::new();
    let app = router(args, cancel.child_token());
    let stopping = cancel.clone();
    let mut bounds = args.bounds.tcp();
    troupe_listen::Descriptors::raise(troupe_listen::descriptors::DEFAULT_RESERVE)
        .fit(&mut [("mcp", &mut bounds)]);
    let listener =
        troupe_listen::BoundedTcp::new(listener, troupe_listen::Gate::new("mcp", bounds));
    let server = troupe_listen::http::serve(listener, app, async move {
        shutdown.await;
        stopping.cancel();
    });
    let drain = Duration::from_millis(args.shutdown_drain_ms);
    tokio::select! {
        served = server => served.context("the HTTP server failed"),
        () = async { cancel.cancelled().await; tokio::time::sleep(drain).await } => {
            tracing::warn!(drain_ms = args.shutdown_drain_ms, "requests still open after the drain time; closing them");
            Ok(())
        }
    }
}
