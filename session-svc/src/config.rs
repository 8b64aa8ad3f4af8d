//! Configuration of the session service: the `troupe-session` flags (each
//! with a `TROUPE_*` variable), the spawn [`Limits`] and the
//! [`MessageLimits`] (the message rate, the fan-out cap).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::Parser;
use troupe_proto::paths::default_data_dir;

use crate::{
    model::{RunnerName, RunnerSpec},
    store::{LeaseTiming, OutputBudget},
};

/// `troupe-session`: the spawn-tree ledger of Troupe, served over gRPC.
#[derive(Clone, Debug, Parser)]
#[command(name = "troupe-session", version, about)]
pub struct Config {
    /// Address to serve gRPC on.
    #[arg(long, env = "TROUPE_LISTEN", default_value = "127.0.0.1:7400")]
    pub listen: SocketAddr,
    /// Address to serve Prometheus metrics on, at `/metrics` (off unless set).
    #[arg(long, env = "TROUPE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Where the embedded database and the operator token's file live.
    #[arg(long, env = "TROUPE_DATA_DIR", default_value_os_t = default_data_dir())]
    pub data_dir: PathBuf,
    /// Database URL: `sqlite://PATH`, or `postgres://USER:PASSWORD@HOST[:PORT]/DB`
    /// (several services may share one PostgreSQL database); default: SQLite
    /// at `<data-dir>/troupe.db`.
    #[arg(long, env = "TROUPE_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Root of the workspaces (each mounted at `/workspace` in its
    /// container, where its agents write). Default: `<data-dir>/workspaces`.
    #[arg(long, env = "TROUPE_WORKSPACES_DIR")]
    pub workspaces_dir: Option<PathBuf>,
    /// The operator's agent definition files, never mounted into a
    /// container: definitions are looked up in the database (`troupe agent
    /// apply`), then in `<dir>/<workspace>/<name>.md`, then `<dir>/<name>.md`.
    /// Default: `<data-dir>/agents`.
    #[arg(long, env = "TROUPE_AGENTS_DIR")]
    pub agents_dir: Option<PathBuf>,
    /// Unix socket to serve on as well (agents in workspace containers reach
    /// the service through it, with no network); `none` to serve on TCP only.
    /// Default: `<data-dir>/run/session.sock`.
    #[arg(long, env = "TROUPE_SESSION_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Operator token. The database keeps one for every service on it: the
    /// first service to start stores its own; a service configured with
    /// another refuses to start. Default: the database's, else the one in
    /// `<data-dir>/operator.token`, else a new one; written to that file.
    #[arg(long, env = "TROUPE_OPERATOR_TOKEN", hide_env_values = true)]
    pub operator_token: Option<String>,
    /// The embedded runner, which starts agents with no registration
    /// (`http://127.0.0.1:7401`; named `default`). Runners may also register
    /// themselves (`troupe-runner --register`); with neither, sessions are
    /// recorded and stay pending.
    #[arg(long, env = "TROUPE_RUNNER_ENDPOINT")]
    pub runner: Option<String>,
    /// How many agents the embedded runner (`--runner`) runs at once, for
    /// placement: a new workspace goes to the live runner with the most
    /// room (capacity minus active sessions).
    #[arg(long, env = "TROUPE_RUNNER_CAPACITY", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub runner_capacity: u32,
    /// How long after its creation a session's agent may still be started
    /// while the runner (or its Docker engine) is unavailable; past it, the
    /// session fails (`lost`).
    #[arg(long, env = "TROUPE_START_DEADLINE_SECS", default_value_t = 300)]
    pub start_deadline_secs: u64,
    /// Bytes of each agent's latest output kept for `GetSession` and callbacks.
    #[arg(long, env = "TROUPE_OUTPUT_TAIL_BYTES", default_value_t = 16 * 1024)]
    pub output_tail_bytes: usize,
    /// Bytes of output events one session keeps for its watchers; past it,
    /// its oldest output is dropped (down to three quarters of it) and an
    /// `output_truncated` event marks the gap.
    #[arg(long, env = "TROUPE_OUTPUT_SESSION_BYTES", default_value_t = OutputBudget::default().session_bytes)]
    pub output_session_bytes: u64,
    /// Bytes of output events kept for all sessions together; past it, the
    /// sessions keeping the most lose their oldest output, as above.
    #[arg(long, env = "TROUPE_OUTPUT_TOTAL_BYTES", default_value_t = OutputBudget::default().total_bytes)]
    pub output_total_bytes: u64,
    /// Lifetime of a session token, in seconds.
    #[arg(long, env = "TROUPE_TOKEN_TTL_SECS", default_value_t = 24 * 3600)]
    pub token_ttl_secs: u64,
    /// Time open calls get to finish at a stop (SIGTERM, SIGINT), in
    /// milliseconds: health goes NOT_SERVING and every stream ends at once,
    /// then what is still open after this is closed.
    #[arg(long, env = "TROUPE_SHUTDOWN_DRAIN_MS", default_value_t = 5000)]
    pub shutdown_drain_ms: u64,
    /// How long a shard's lease of the background work (driving its
    /// workspaces' agents; the fleet's shard also exports and prunes) lasts
    /// unless renewed, in milliseconds: when its holder dies, another
    /// service takes its shards over after at most this.
    #[arg(long, env = "TROUPE_LEASE_TTL_MS", default_value_t = 2000,
          value_parser = clap::value_parser!(u64).range(100..))]
    pub lease_ttl_ms: u64,
    /// How often a service renews its shards' leases and rebalances, in
    /// milliseconds (well under `--lease-ttl-ms`): a replica that joins or
    /// leaves moves shards within a few of these.
    #[arg(long, env = "TROUPE_LEASE_RENEW_MS", default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(10..))]
    pub lease_renew_ms: u64,
    /// Events kept for watchers that resume; older ones are pruned.
    #[arg(long, env = "TROUPE_EVENT_RETENTION", default_value_t = 100_000)]
    pub event_retention: u64,
    /// How long a request id is remembered, in seconds: a create or send
    /// retried with the same request id within this replays the first
    /// call's answer; after it, the call is new. Older records are pruned.
    #[arg(long, env = "TROUPE_REQUEST_ID_RETENTION_SECS", default_value_t = 24 * 3600,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub request_id_retention_secs: u64,
    /// Longest result a session may finish its task with (`FinishSession`,
    /// the bridge's `finish`), in bytes; a longer one is refused
    /// INVALID_ARGUMENT.
    #[arg(long, env = "TROUPE_MAX_RESULT_BYTES", default_value_t = 64 * 1024)]
    pub max_result_bytes: usize,
    /// How long a session's process may go on after the session finished
    /// its task, in milliseconds, to exit on its own; then it is stopped as
    /// a terminated session's is.
    #[arg(long, env = "TROUPE_FINISH_GRACE_MS", default_value_t = 10_000)]
    pub finish_grace_ms: u64,
    /// The model gateway's providers, keys, prices and which workspaces may
    /// use which models: a YAML file (docs/operating.md). Without it, model
    /// calls are refused as not served.
    #[arg(long, env = "TROUPE_GATEWAY_CONFIG")]
    pub gateway_config: Option<PathBuf>,
    /// Store this service's limits (the spawn and message limits below) in
    /// the database in place of those stored there, for every service on it
    /// (replicas follow within a second). Without it a service whose limits
    /// differ from the database's refuses to start on PostgreSQL, naming
    /// the flags; on SQLite, where a service is alone, its own always win.
    #[arg(long, env = "TROUPE_ADOPT_LIMITS")]
    pub adopt_limits: bool,
    #[command(flatten)]
    pub limits: Limits,
    #[command(flatten)]
    pub messaging: MessageLimits,
    #[command(flatten)]
    pub console: crate::console::ConsoleArgs,
    /// Connection bounds of every listener (gRPC, the agents' socket, the
    /// console, metrics).
    #[command(flatten)]
    pub bounds: troupe_listen::ListenArgs,
}

pub use troupe_domain::limits::{Limits, MessageLimits};

impl Config {
    /// Returns a configuration with every default, rooted at `data_dir`.
    pub fn with_data_dir(data_dir: impl Into<PathBuf>) -> Self {
        let mut config = Config::parse_from(["troupe-session"]);
        config.data_dir = data_dir.into();
        config
    }

    /// This service's spawn and message limits, as one set.
    pub fn limit_set(&self) -> crate::rules::LimitSet {
        crate::rules::LimitSet {
            limits: self.limits,
            messaging: self.messaging,
        }
    }

    pub fn database_url(&self) -> String {
        self.database_url.clone().unwrap_or_else(|| {
            format!(
                "sqlite://{}?mode=rwc",
                self.data_dir.join("troupe.db").display()
            )
        })
    }

    pub fn workspaces_dir(&self) -> PathBuf {
        self.workspaces_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("workspaces"))
    }

    pub fn agents_dir(&self) -> PathBuf {
        self.agents_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("agents"))
    }

    /// Where definition files are read from, and where they never are.
    pub fn definition_files(&self) -> crate::agents::DefinitionFiles {
        crate::agents::DefinitionFiles {
            agents_dir: self.agents_dir(),
            workspaces_dir: self.workspaces_dir(),
        }
    }

    /// The Unix socket to serve on, if any.
    pub fn socket(&self) -> Option<PathBuf> {
        match &self.socket {
            Some(path) if path.as_os_str() == "none" => None,
            Some(path) => Some(path.clone()),
            None => Some(troupe_proto::paths::session_socket_path(&self.data_dir)),
        }
    }

    pub fn shutdown_drain(&self) -> Duration {
        Duration::from_millis(self.shutdown_drain_ms)
    }

    /// How much agents' output the store keeps.
    pub fn output_budget(&self) -> OutputBudget {
        OutputBudget {
            session_bytes: self.output_session_bytes,
            total_bytes: self.output_total_bytes,
        }
    }

    pub fn token_ttl(&self) -> Duration {
        Duration::from_secs(self.token_ttl_secs)
    }

    /// The lease's timing; the renewal must come well within the lease's time.
    pub fn lease_timing(&self) -> anyhow::Result<LeaseTiming> {
        anyhow::ensure!(
            self.lease_renew_ms * 2 <= self.lease_ttl_ms,
            "--lease-renew-ms ({}) must be at most half of --lease-ttl-ms ({})",
            self.lease_renew_ms,
            self.lease_ttl_ms
        );
        Ok(LeaseTiming {
            ttl: Duration::from_millis(self.lease_ttl_ms),
            renew_every: Duration::from_millis(self.lease_renew_ms),
        })
    }

    /// The embedded runner (`--runner`), if any.
    pub fn embedded_runner(&self) -> anyhow::Result<Option<RunnerSpec>> {
        let Some(endpoint) = &self.runner else {
            return Ok(None);
        };
        troupe_proto::endpoint::connect_lazy(endpoint)
            .map_err(|e| anyhow::anyhow!("bad runner endpoint {endpoint:?}: {e}"))?;
        Ok(Some(RunnerSpec {
            name: RunnerName::embedded(),
            endpoint: endpoint.clone(),
            capacity: self.runner_capacity,
        }))
    }

    pub fn start_deadline(&self) -> Duration {
        Duration::from_secs(self.start_deadline_secs)
    }

    /// The gateway's configuration, read and checked (keys included), if
    /// one is given.
    pub fn gateway(&self) -> anyhow::Result<Option<crate::gateway::config::GatewayConfig>> {
        self.gateway_config
            .as_deref()
            .map(crate::gateway::config::GatewayConfig::load)
            .transpose()
            .map_err(anyhow::Error::from)
    }

    /// How long a request id is remembered (`--request-id-retention-secs`).
    pub fn request_id_retention(&self) -> Duration {
        Duration::from_secs(self.request_id_retention_secs)
    }
}
