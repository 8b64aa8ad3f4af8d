//! Configuration of the runner: the `troupe-runner` flags, each with a
//! `TROUPE_*` variable; and [`AgentSocket`], the socket agents reach the
//! session service through (the service's own on this host, or the relay's).

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use clap::Parser;
use troupe_proto::paths::default_data_dir;

use crate::relay;

/// `troupe-runner`: runs each session's agent by `docker exec` in its
/// workspace's persistent container, and streams its output back.
#[derive(Clone, Debug, Parser)]
#[command(name = "troupe-runner", version, about)]
pub struct Config {
    /// Address to serve gRPC on.
    #[arg(long, env = "TROUPE_RUNNER_LISTEN", default_value = "127.0.0.1:7401")]
    pub listen: SocketAddr,
    /// Address to serve Prometheus metrics on, at `/metrics` (off unless set).
    #[arg(long, env = "TROUPE_RUNNER_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Troupe's data directory; the runner keeps its state in `<data-dir>/runner`.
    #[arg(long, env = "TROUPE_DATA_DIR", default_value_os_t = default_data_dir())]
    pub data_dir: PathBuf,
    /// Root of the workspaces; `<dir>/<workspace>` is mounted at `/workspace`.
    /// Default: `<data-dir>/workspaces`.
    #[arg(long, env = "TROUPE_WORKSPACES_DIR")]
    pub workspaces_dir: Option<PathBuf>,
    /// Operator token callers must present; default: read from, or generated
    /// into, `<data-dir>/operator.token` (the session service's).
    #[arg(long, env = "TROUPE_OPERATOR_TOKEN", hide_env_values = true)]
    pub operator_token: Option<String>,
    /// The Docker engine (`unix:///var/run/docker.sock`, `tcp://host:2375`).
    /// Default: Docker's own default socket.
    #[arg(long, env = "DOCKER_HOST")]
    pub docker_host: Option<String>,
    /// Image of new workspace containers (build it with `scripts/build-image`).
    #[arg(long, env = "TROUPE_IMAGE", default_value = "troupe-workspace:latest")]
    pub image: String,
    /// Directory mounted read-only at `/opt/troupe/bin`. Default: the
    /// supervisor and bridge binaries next to `troupe-runner`, copied into
    /// `<data-dir>/runner/tools`.
    #[arg(long, env = "TROUPE_TOOLS_DIR")]
    pub tools_dir: Option<PathBuf>,
    /// The session service's Unix socket, when it runs on this host; its
    /// directory is mounted read-only at `/run/troupe/session`, so agents
    /// reach the service with no network. Default:
    /// `<data-dir>/run/session.sock`, unless `--session-endpoint` is given.
    #[arg(
        long,
        env = "TROUPE_SESSION_SOCKET",
        conflicts_with = "session_endpoint"
    )]
    pub session_socket: Option<PathBuf>,
    /// The session service's TCP endpoints (`http://host:port`), when it runs
    /// elsewhere; replicas' endpoints separated by commas. The runner then
    /// serves agents a socket of its own, `<data-dir>/runner/relay/session.sock`,
    /// mounted where the service's would be, and relays each connection
    /// byte for byte to the first endpoint that accepts one. It adds no
    /// token or header: agents' calls carry their own.
    #[arg(
        long,
        env = "TROUPE_SESSION_ENDPOINT",
        value_name = "ENDPOINT[,ENDPOINT...]",
        value_delimiter = ','
    )]
    pub session_endpoint: Vec<String>,
    /// Most agents' connections relayed at once (with `--session-endpoint`);
    /// one beyond is closed at once, and counted.
    #[arg(long, env = "TROUPE_RELAY_MAX_CONNECTIONS", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub relay_max_connections: u32,
    /// Network of workspace containers (`none`, `bridge`, a network name).
    #[arg(long, env = "TROUPE_NETWORK", default_value = "none")]
    pub network: String,
    /// Most processes (and threads) one workspace container may run (0: no
    /// limit). A workspace runs at most (this - 32) / --exec-pids-limit
    /// agents at once (31 by default); a start beyond is refused, so agents
    /// at their limits never keep another from starting.
    #[arg(long, env = "TROUPE_PIDS_LIMIT", default_value_t = 8192)]
    pub pids_limit: i64,
    /// Most processes (and threads) one exec may run, its supervisor's
    /// included (RLIMIT_NPROC of its uid; at least 16), so one agent's fork
    /// bomb leaves room for the others.
    #[arg(long, env = "TROUPE_EXEC_PIDS_LIMIT", default_value_t = 256)]
    pub exec_pids_limit: u64,
    /// Memory limit of a workspace container, in MiB (0: none).
    #[arg(long, env = "TROUPE_MEMORY_MIB", default_value_t = 4096)]
    pub memory_mib: i64,
    /// Output an exec may produce ahead of its watchers before it is paused, in KiB.
    #[arg(long, env = "TROUPE_OUTPUT_WINDOW_KIB", default_value_t = 16 * 1024)]
    pub output_window_kib: u64,
    /// Most bytes one exec's output log keeps, in MiB. Past it, the oldest
    /// output goes as `--exec-log-policy` says.
    #[arg(long, env = "TROUPE_EXEC_LOG_MAX_MIB", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub exec_log_max_mib: u64,
    /// What happens to an exec whose log reaches `--exec-log-max-mib`:
    /// `drop` its oldest output (watchers are told what was dropped; the
    /// agent never waits), or `pause` the agent until a watcher has read
    /// what it would drop.
    #[arg(long, env = "TROUPE_EXEC_LOG_POLICY", value_enum, default_value_t = LogPolicy::Drop)]
    pub exec_log_policy: LogPolicy,
    /// Most bytes all exec logs together keep, in MiB. Past it, the oldest
    /// output of exited execs goes first, then that of the largest logs.
    #[arg(long, env = "TROUPE_LOGS_MAX_MIB", default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub logs_max_mib: u64,
    /// First uid of exec processes; the workspace group is this gid.
    #[arg(long, env = "TROUPE_UID_BASE", default_value_t = 100_000)]
    pub uid_base: u32,
    /// Grace between SIGTERM and SIGKILL when a timeout ends an exec.
    #[arg(long, env = "TROUPE_TIMEOUT_GRACE_MS", default_value_t = 5000)]
    pub timeout_grace_ms: u64,
    /// Time open calls get to finish at a stop (SIGTERM, SIGINT), in
    /// milliseconds: health goes NOT_SERVING and every watch ends at once,
    /// then what is still open after this is closed. Agents keep running.
    #[arg(long, env = "TROUPE_SHUTDOWN_DRAIN_MS", default_value_t = 5000)]
    pub shutdown_drain_ms: u64,
    /// How long an exited exec stays listed and watchable before its log and
    /// directory are removed.
    #[arg(long, env = "TROUPE_KEEP_EXITED_SECS", default_value_t = 3600)]
    pub keep_exited_secs: u64,
    /// What workspace containers' names start with
    /// (`<prefix>-<workspace>-<hash>`): runners that share one Docker engine
    /// each need their own (and disjoint `--uid-base` ranges).
    #[arg(long, env = "TROUPE_CONTAINER_PREFIX", default_value = crate::docker::DEFAULT_PREFIX,
          value_parser = container_prefix)]
    pub container_prefix: String,
    #[command(flatten)]
    pub registration: Registration,
    /// Connection bounds of the gRPC listener.
    #[command(flatten)]
    pub bounds: troupe_listen::ListenArgs,
}

/// A container name prefix: a slug of at most 32 bytes.
fn container_prefix(value: &str) -> Result<String, String> {
    if troupe_proto::names::is_slug(value) && value.len() <= 32 {
        Ok(value.to_owned())
    } else {
        Err(
            "a prefix is 1 to 32 letters, digits, '-' or '_', starting with a letter or digit"
                .to_owned(),
        )
    }
}

/// Registration with session services, as one of several runners.
#[derive(Clone, Debug, clap::Args)]
pub struct Registration {
    /// Session service endpoints to register with (`http://host:port`,
    /// replicas separated by commas), with the operator token; the runner
    /// then renews its lease every `--register-every-ms`. Off unless set:
    /// a runner given to the service as `--runner` needs none.
    #[arg(
        long,
        env = "TROUPE_RUNNER_REGISTER",
        value_name = "ENDPOINT[,ENDPOINT...]",
        value_delimiter = ','
    )]
    pub register: Vec<String>,
    /// This runner's endpoint as the session service reaches it
    /// (`http://host:port`). Default: `http://` and `--listen`.
    #[arg(long, env = "TROUPE_RUNNER_ADVERTISE")]
    pub advertise: Option<String>,
    /// This runner's name among the session service's runners (a slug,
    /// unique to the runner; not `default`). Default: the host name.
    #[arg(long, env = "TROUPE_RUNNER_NAME")]
    pub name: Option<String>,
    /// Most agents this runner runs at once, for placement: a new workspace
    /// goes to the live runner with the most room (this minus its active
    /// sessions).
    #[arg(long, env = "TROUPE_RUNNER_CAPACITY", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub capacity: u32,
    /// How long a registration lasts unless renewed, in milliseconds: this
    /// long after the runner's last renewal (it died, or cannot reach the
    /// service), its running sessions fail `runner_lost`.
    #[arg(long, env = "TROUPE_RUNNER_REGISTER_TTL_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u32).range(500..=600_000))]
    pub register_ttl_ms: u32,
    /// How often the registration is renewed, in milliseconds (at most half
    /// of `--register-ttl-ms`).
    #[arg(long, env = "TROUPE_RUNNER_REGISTER_EVERY_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(50..))]
    pub register_every_ms: u32,
}

/// What the runner does with an exec whose log is full.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogPolicy {
    /// Drop the oldest output, with a marker; the agent runs on.
    #[default]
    Drop,
    /// Keep the output nobody has read, pausing the agent until a watcher reads it.
    Pause,
}

impl Config {
    /// A configuration with every default, rooted at `data_dir`.
    pub fn with_data_dir(data_dir: impl Into<PathBuf>) -> Self {
        let mut config = Config::parse_from(["troupe-runner"]);
        config.data_dir = data_dir.into();
        config
    }

    /// Where the runner keeps its own state.
    pub fn state_dir(&self) -> PathBuf {
        self.data_dir.join("runner")
    }

    pub fn workspaces_dir(&self) -> PathBuf {
        self.workspaces_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("workspaces"))
    }

    /// How agents reach the session service: its own socket on this host,
    /// or the runner's relay. Both given is an error.
    pub fn agent_socket(&self) -> anyhow::Result<AgentSocket> {
        if self.session_endpoint.is_empty() {
            return Ok(AgentSocket::Local(
                self.session_socket
                    .clone()
                    .unwrap_or_else(|| troupe_proto::paths::session_socket_path(&self.data_dir)),
            ));
        }
        anyhow::ensure!(
            self.session_socket.is_none(),
            "--session-socket and --session-endpoint exclude each other: give the \
             session service's socket when it runs on this host, its endpoints when \
             it runs elsewhere"
        );
        Ok(AgentSocket::Relayed {
            socket: self.state_dir().join("relay").join(relay::SOCKET_NAME),
            upstreams: relay::parse_endpoints(&self.session_endpoint)?,
        })
    }
}

/// The socket agents reach the session service through, whose directory
/// is mounted at `/run/troupe/session`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentSocket {
    /// The session service's own, on this host.
    Local(PathBuf),
    /// The runner's, relayed to the service's TCP endpoints.
    Relayed {
        socket: PathBuf,
        upstreams: Vec<relay::Upstream>,
    },
}

impl AgentSocket {
    /// The socket's path on this host.
    pub fn path(&self) -> &Path {
        match self {
            AgentSocket::Local(path) => path,
            AgentSocket::Relayed { socket, .. } => socket,
        }
    }
}
