//! `troupe-session`: parses the configuration, binds, and serves until
//! SIGINT or SIGTERM. A failure is one line on stderr (the error and its
//! causes) and exit status 1, never a panic's backtrace.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use troupe_session_svc::Config;

/// The list path builds and frees thousands of small strings per call; after
/// a long run of writes the system allocator's fragmented heap made a list of
/// 1,000 take half again as long (measured with the `session` bench).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process. mimalloc asks for them,
/// and memory it hands back to the kernel comes back as a fresh 2 MiB page,
/// zeroed whole on the request path that touches it (3% of an exporting
/// service's samples in `perf`). Best effort: where the kernel refuses, the
/// service runs as before.
fn small_pages() {
    let _ = nix::sys::prctl::set_thp_disable(true);
}

fn main() -> ExitCode {
    small_pages();
    match session() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("troupe-session: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn session() -> anyhow::Result<()> {
    let config = Config::parse();
    let telemetry = troupe_telemetry::init("troupe-session", "info", config.metrics_listen)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let served =
        troupe_session_svc::serve(config, listener, troupe_proto::serving::shutdown_signal()).await;
    telemetry.shutdown().await;
    served
}
