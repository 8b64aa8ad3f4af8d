//! `troupe-runner`: parses the configuration, binds, and serves until
//! SIGINT or SIGTERM. Called as `troupe-supervisor` (its copy in the tools
//! directory), it is the in-container supervisor instead.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use troupe_runner_svc::{Config, layout};

fn main() -> ExitCode {
    let called_as = std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_owned()));
    if called_as.as_deref() == Some(std::ffi::OsStr::new(layout::SUPERVISOR)) {
        return troupe_runner_svc::supervisor::main();
    }
    match runner() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("troupe-runner: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn runner() -> anyhow::Result<()> {
    let config = Config::parse();
    let telemetry = troupe_telemetry::init("troupe-runner", "info", config.metrics_listen)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let served =
        troupe_runner_svc::serve(config, listener, troupe_proto::serving::shutdown_signal()).await;
    telemetry.shutdown().await;
    served
}
