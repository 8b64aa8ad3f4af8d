//! `troupe`: parses the command line and runs it; see the `troupe_cli` crate.

use std::process::ExitCode;

use clap::Parser;
use troupe_cli::cli::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    troupe_cli::run(Cli::parse()).await
}
