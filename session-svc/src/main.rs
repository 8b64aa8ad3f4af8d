//! `troupe-session`: parses the configuration, binds, and serves until
//! SIGINT or SIGTERM.

use anyhow::Context;
use clap::Parser;
use troupe_session_svc::Config;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let config = Config::parse();
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    troupe_session_svc::serve(config, listener, troupe_proto::serving::shutdown_signal()).await
}
