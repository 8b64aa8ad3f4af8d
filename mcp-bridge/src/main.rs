//! `troupe-mcp`: parses the command line and runs the bridge on stdio (the
//! default) or as a shared streamable HTTP endpoint, or, as `claude-input`,
//! passes Troupe's stdin messages on to Claude Code, or, as `agent RUNTIME`,
//! runs an agent CLI as a member of its team.

use std::process::ExitCode;

use clap::Parser;
use troupe_mcp_bridge::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("troupe-mcp: error: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(serve(cli));
    // Stopped by a signal, a stdio bridge may still be reading stdin on a
    // thread no one can interrupt: exit without waiting for its line.
    runtime.shutdown_background();
    code
}

async fn serve(cli: Cli) -> ExitCode {
    // stdout carries the MCP protocol on stdio, and Claude Code's input
    // for claude-input: logs go to stderr.
    let telemetry = match troupe_telemetry::init("troupe-mcp", cli.default_log_filter(), None) {
        Ok(telemetry) => telemetry,
        Err(err) => {
            eprintln!("troupe-mcp: error: {err:#}");
            return ExitCode::FAILURE;
        }
    };
    let ran = troupe_mcp_bridge::run(cli).await;
    telemetry.shutdown().await;
    match ran {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("troupe-mcp: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
