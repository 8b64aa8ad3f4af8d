//! `troupe`, the operator's command line for Troupe's session service: create
//! spawn trees and child sessions, list, inspect, message, watch and end them,
//! read the audit log, manage the agent definitions kept in the database,
//! list the runners.
//! Text output by default, JSON with `--json`.
//!
//! - [`cli`]: the command line (clap derive), flags with `TROUPE_*` variables.
//! - [`connect`]: endpoints, token lookup (`--token`, `TROUPE_OPERATOR_TOKEN`,
//!   `<data-dir>/operator.token`) and the authenticated client of each
//!   endpoint; [`Ctx::call`] moves on from an endpoint it cannot reach.
//! - [`cmd`]: one module per command group.
//! - [`render`]: text and JSON forms of every protocol message.
//! - [`tree`], [`table`]: spawn trees and tables as text.
//! - [`error`]: how failures are reported (ErrorInfo reason and metadata).
//! - [`out`]: stdout writes that survive a closed pipe, terminal-safe.
//! - [`safe`]: terminal-safe forms of agent-written text.

pub mod cli;
pub mod cmd;
pub mod connect;
pub mod error;
pub mod out;
pub mod render;
pub mod safe;
pub mod table;
pub mod tree;

use std::process::ExitCode;

use cli::{Cli, Command};
use connect::{Client, FleetClient};
use error::{Reported, Setting};
use tonic::{Response, Status};
use troupe_proto::failover::Endpoints;

/// What every command runs with.
pub struct Ctx {
    pub endpoints: Endpoints<Client>,
    /// The fleet service on the same endpoints (`troupe runner`).
    pub fleet: Endpoints<FleetClient>,
    pub json: bool,
    pub setting: Setting,
}

impl Ctx {
    /// Calls `rpc` with `message`, on the next endpoint while one cannot be
    /// reached. Every call the CLI makes is safe to repeat: reads, watches
    /// (reopened after their cursor), terminations, and creates and sends,
    /// which always carry a request id.
    pub async fn call<M, R, F, Fut>(&self, message: &M, rpc: F) -> Result<R, Status>
    where
        M: Clone,
        F: Fn(Client, M) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        self.endpoints.call(message, rpc).await
    }

    /// As [`Ctx::call`], on the fleet service.
    pub async fn call_fleet<M, R, F, Fut>(&self, message: &M, rpc: F) -> Result<R, Status>
    where
        M: Clone,
        F: Fn(FleetClient, M) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        self.fleet.call(message, rpc).await
    }
}

/// Runs a parsed command line; returns 1 after reporting any failure.
pub async fn run(cli: Cli) -> ExitCode {
    let mut setting = Setting {
        endpoint: connect::endpoint_urls(&cli.global.endpoint)
            .map(|urls| urls.join(","))
            .unwrap_or_default(),
        token_origin: None,
    };
    match execute(&cli, &mut setting).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if error::is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) if err.is::<Reported>() => ExitCode::FAILURE,
        Err(err) => {
            error::report(&err, cli.global.json, &setting);
            ExitCode::FAILURE
        }
    }
}

async fn execute(cli: &Cli, setting: &mut Setting) -> anyhow::Result<()> {
    let (token, origin) = connect::resolve_token(&cli.global)?;
    setting.token_origin = Some(origin);
    let endpoints = connect::connect(&cli.global.endpoint, &token)?;
    let fleet = connect::connect_fleet(&cli.global.endpoint, &token)?;
    let mut ctx = Ctx {
        endpoints,
        fleet,
        json: cli.global.json,
        setting: std::mem::take(setting),
    };
    let result = match &cli.command {
        Command::Session { command } => cmd::session(&mut ctx, command).await,
        Command::Audit(args) => cmd::audit::run(&mut ctx, args).await,
        Command::Agent { command } => cmd::agent::run(&mut ctx, command).await,
        Command::Runner { command } => cmd::runner::run(&mut ctx, command).await,
        Command::Replica { command } => cmd::replica::run(&mut ctx, command).await,
        Command::Group { command } => cmd::group::run(&mut ctx, command).await,
    };
    *setting = ctx.setting;
    result
}
