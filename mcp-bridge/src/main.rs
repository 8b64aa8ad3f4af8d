//! `troupe-mcp`: parses the command line and runs the bridge on stdio (the
//! default) or as a shared streamable HTTP endpoint, or, as `claude-input`,
//! passes Troupe's stdin messages on to Claude Code.

use std::{io::IsTerminal, process::ExitCode};

use clap::Parser;
use troupe_mcp_bridge::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // stdout carries the MCP protocol on stdio, and Claude Code's input
    // for claude-input: logs go to stderr.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| cli.default_log_filter().into()),
        )
        .init();
    match troupe_mcp_bridge::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("troupe-mcp: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
