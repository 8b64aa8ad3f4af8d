//! `troupe-session`: parses the configuration, binds, and serves until
//! SIGINT or SIGTERM.

use anyhow::Context;
use clap::Parser;
use troupe_session_svc::Config;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    let telemetry = troupe_proto::telemetry::init("troupe-session", "info", config.metrics_listen)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let served =
        troupe_session_svc::serve(config, listener, troupe_proto::serving::shutdown_signal()).await;
    telemetry.shutdown().await;
    served
}
