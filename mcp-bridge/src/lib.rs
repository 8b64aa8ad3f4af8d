//! Troupe's MCP bridge (`troupe-mcp`): the tools through which an agent
//! creates child sessions, messages the sessions of its workspace, lists,
//! inspects, waits for and terminates them. Each tool is one or a few calls
//! of `troupe.session.v1.SessionService`, made with the calling session's
//! own token; the bridge holds no authority of its own, and every rule
//! (workspace, trust, quotas, visibility) is the session service's.
//!
//! - [`run`]: the two transports. stdio (the default) serves one session,
//!   whose token and endpoint come from `TROUPE_SESSION_TOKEN` and
//!   `TROUPE_SESSION_ENDPOINT`; `http` serves any number of sessions on one
//!   streamable HTTP endpoint, each request carrying its own bearer token.
//! - [`caller`]: where a tool call's token comes from, and the check of the
//!   `X-Agent-Session-Id` hint against it.
//! - [`backend`]: the channel to the session service and the authenticated calls.
//! - [`tools`]: the fourteen tools, their arguments (JSON schemas) and descriptions.
//! - [`view`]: the JSON the tools return.
//! - [`failure`]: refusals as MCP tool errors (reason, quota left, advice).
//! - [`http`]: the streamable HTTP service mounted in axum.
//! - [`stdio`]: the stdio transport, which answers every line it cannot
//!   read (too long, not JSON, nested too deep) with a JSON-RPC error.
//! - [`claude`]: `claude-input`, which is no server: it turns Troupe's stdin
//!   message lines into Claude Code's stream-json user messages.
//! - [`agent`]: `agent RUNTIME`, which is no server either: it runs an agent
//!   CLI (Claude Code, Codex, Gemini CLI, OpenCode, Aider) as a member of
//!   its team, with this program as its MCP server.

pub mod agent;
pub mod backend;
pub mod caller;
pub mod claude;
pub mod failure;
pub mod http;
pub mod stdio;
pub mod tools;
pub mod view;

use std::{net::SocketAddr, sync::Arc};

use anyhow::Context;
use clap::{Parser, Subcommand};
use rmcp::ServiceExt;
use troupe_proto::agent::Runtime;

use crate::{backend::Backend, caller::Identity, tools::Bridge};

/// Environment variable holding the session's token (stdio).
pub const TOKEN_ENV: &str = troupe_proto::agent::env::SESSION_TOKEN;
/// Environment variable holding the session service's endpoint.
pub const ENDPOINT_ENV: &str = troupe_proto::agent::env::SESSION_ENDPOINT;

/// The command line of `troupe-mcp`.
#[derive(Debug, Parser)]
#[command(
    name = "troupe-mcp",
    version,
    about = "MCP server that lets an agent spawn, message and list Troupe sessions",
    long_about = "MCP server that lets an agent spawn, message and list Troupe sessions.\n\n\
        With no command (or `stdio`) it serves one session over stdio: its token and the \
        session service's endpoint come from TROUPE_SESSION_TOKEN and TROUPE_SESSION_ENDPOINT \
        (several endpoints of replicas separated by commas: a call that cannot reach one goes \
        on to the next). \
        `http` serves many sessions on one streamable HTTP endpoint; each request carries its \
        session's token as `Authorization: Bearer <token>`. `claude-input` serves nothing: it \
        turns Troupe's message lines on stdin into Claude Code stream-json user messages on \
        stdout, for `... | claude -p --input-format stream-json`. `agent RUNTIME` runs an \
        agent CLI as a member of its team: what an agent definition's `runtime` runs."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The transports, and the input adapter for Claude Code.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the session named by TROUPE_SESSION_TOKEN over stdin/stdout (the default).
    Stdio,
    /// Serve every session on one streamable HTTP endpoint (`/mcp`).
    Http(HttpArgs),
    /// Turn Troupe's message lines on stdin into Claude Code stream-json user
    /// messages on stdout, one per line, until stdin ends.
    ClaudeInput,
    /// Run an agent CLI as a member of its team (what a definition's
    /// `runtime` runs): claude-code, codex, gemini-cli, opencode or aider.
    Agent {
        #[arg(value_parser = parse_runtime)]
        runtime: Runtime,
    },
}

fn parse_runtime(name: &str) -> Result<Runtime, String> {
    Runtime::parse(name).ok_or_else(|| format!("use one of {}", Runtime::names()))
}

/// Flags of `troupe-mcp http`.
#[derive(Debug, Clone, clap::Args)]
pub struct HttpArgs {
    /// Address to listen on.
    #[arg(long, env = "TROUPE_MCP_LISTEN", default_value = "127.0.0.1:7402")]
    pub listen: SocketAddr,
    /// The session service: `http://host:port` or `unix:///path/to/session.sock`.
    /// For replicas on one database give several, separated by commas (or the
    /// flag repeated): a call that cannot reach one (refused, lost, the server
    /// stopping) goes on to the next, each tried once (a lone one twice,
    /// 200 ms apart).
    #[arg(
        long,
        env = ENDPOINT_ENV,
        value_name = "ENDPOINT[,ENDPOINT...]",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7400"
    )]
    pub endpoint: Vec<String>,
    /// A `Host` header value to accept besides the loopback names (repeatable):
    /// needed when clients reach the bridge by another name or address.
    #[arg(long = "allowed-host", value_name = "HOST")]
    pub allowed_hosts: Vec<String>,
    /// Time open requests get to finish at a stop (SIGTERM, SIGINT), in
    /// milliseconds: MCP sessions end at once, then what is still open
    /// after this is closed.
    #[arg(long, env = "TROUPE_SHUTDOWN_DRAIN_MS", default_value_t = 5000)]
    pub shutdown_drain_ms: u64,
    /// Connection bounds of the HTTP listener.
    #[command(flatten)]
    pub bounds: troupe_listen::ListenArgs,
}

impl Cli {
    /// The log filter when `RUST_LOG` is not set: quiet on stdio, where the
    /// agent's MCP client shows stderr as errors.
    pub fn default_log_filter(&self) -> &'static str {
        match self.command {
            Some(Command::Http(_)) => "info,rmcp=warn",
            _ => "warn",
        }
    }
}

/// Runs the transport the command line names until SIGINT or SIGTERM,
/// or (stdio) until its client leaves; `claude-input` runs until stdin ends,
/// `agent` until its CLI is done. Returns the exit code.
pub async fn run(cli: Cli) -> anyhow::Result<u8> {
    if let Some(Command::Agent { runtime }) = cli.command {
        let code = agent::run(runtime).await?;
        return Ok(u8::try_from(code).unwrap_or(1));
    }
    serve(cli).await.map(|()| 0)
}

async fn serve(cli: Cli) -> anyhow::Result<()> {
    match cli.command.unwrap_or(Command::Stdio) {
        Command::Agent { .. } => unreachable!("run handles agent"),
        Command::Stdio => run_stdio().await,
        Command::ClaudeInput => tokio::task::spawn_blocking(|| {
            claude::forward(std::io::stdin().lock(), std::io::stdout().lock())
                .context("cannot pass Troupe's messages on to Claude Code")
        })
        .await
        .context("the input task failed")?,
        Command::Http(args) => {
            let listener = tokio::net::TcpListener::bind(args.listen)
                .await
                .with_context(|| format!("cannot listen on {}", args.listen))?;
            tracing::info!(
                listen = %listener.local_addr()?,
                endpoint = %args.endpoint.join(","),
                "serving MCP on http://{}/mcp",
                listener.local_addr()?
            );
            http::serve(listener, &args, shutdown_signal()).await
        }
    }
}

async fn run_stdio() -> anyhow::Result<()> {
    let token = required_env(TOKEN_ENV, "the calling session's token")?;
    let endpoint = required_env(
        ENDPOINT_ENV,
        "the session service, e.g. unix:///run/troupe/session/session.sock or http://127.0.0.1:7400",
    )?;
    let backend = Arc::new(Backend::new(endpoint));
    let traceparent = std::env::var("TRACEPARENT").ok();
    let bridge = Bridge::new(backend, Identity::fixed(&token, traceparent.as_deref())?);
    let service = bridge
        .serve(stdio::transport())
        .await
        .context("the MCP client did not complete the handshake on stdin/stdout")?;
    // A stop (SIGTERM, SIGINT) ends the session as the client's leaving
    // does: the call in progress is dropped, and the bridge exits cleanly.
    let cancel = service.cancellation_token();
    let stop = tokio::spawn(async move {
        shutdown_signal().await;
        cancel.cancel();
    });
    let quit = service.waiting().await;
    stop.abort();
    quit.context("the MCP service failed")?;
    Ok(())
}

fn required_env(name: &str, what: &str) -> anyhow::Result<String> {
    match std::env::var(name) {
        Ok(value) if !value.trim().is_empty() => Ok(value.trim().to_owned()),
        Ok(_) => anyhow::bail!(
            "{name} is empty; it must hold {what} (the runner sets it for every agent; \
             or run `troupe-mcp http` and send the token per request)"
        ),
        Err(_) => anyhow::bail!(
            "{name} is not set; it must hold {what} (the runner sets it for every agent; \
             or run `troupe-mcp http` and send the token per request)"
        ),
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM");
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}
