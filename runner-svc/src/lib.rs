//! Troupe's runner service: each session's agent runs as a `docker exec`
//! process in its workspace's persistent container; its output streams back
//! as numbered events, served over gRPC as `troupe.runner.v1.RunnerService`.
//!
//! - [`config`]: flags and `TROUPE_*` variables.
//! - [`docker`]: the workspace containers and execs (the only Docker client).
//! - [`engine_watch`]: pings the engine; health follows it.
//! - [`exec`]: execs, their logs, watchers, stdin, termination, recovery.
//! - [`request`]: what a start asks for, its checks, the exec's environment.
//! - [`admission`]: how many execs a workspace container holds at once.
//! - [`supervisor`]: the in-container supervisor (this binary, run as
//!   `troupe-supervisor`).
//! - [`scope`]: the supervisor's Landlock write scope for a scoped agent.
//! - [`forward`]: the supervisor's model port, each agent's way to the model
//!   gateway over the container's loopback.
//! - [`log`], [`layout`]: the log format and the exec directory, shared by
//!   the runner and the supervisor.
//! - [`service`]: the gRPC handlers.
//! - [`register`]: registration with the session service, as one of several runners.
//! - [`relay`]: the agents' socket relayed to a session service elsewhere
//!   (`--session-endpoint`).
//! - [`metrics`]: exec start latency, container recreations, the relay.
//!
//! [`serve`] runs the whole service on a listener the caller bound: it copies
//! the tools to `<data-dir>/runner/tools` (unless given a tools directory),
//! binds the relay's socket (with `--session-endpoint`), connects to
//! Docker, recovers the execs of a
//! previous run, and serves `RunnerService` (every call of it needs the
//! operator token), health and reflection.

pub mod admission;
pub mod config;
pub mod docker;
pub mod engine_watch;
pub mod exec;
pub mod forward;
pub mod layout;
pub mod log;
pub mod metrics;
pub mod register;
pub mod relay;
pub mod request;
pub mod scope;
pub mod service;
pub mod supervisor;

use std::{
    future::Future,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use troupe_proto::{drain::Drain, runner::runner_service_server::RunnerServiceServer};

pub use config::{AgentSocket, Config};

use crate::{
    docker::{ContainerSpec, Engine},
    exec::{Runner, Settings},
    relay::Relay,
    service::Service,
};

/// Serves the runner on `listener` until `shutdown` completes.
///
/// Prepares the tools directory, asks the Docker engine whether it answers,
/// re-attaches to the execs of a previous run, then serves `RunnerService`,
/// gRPC health and server reflection. An engine that does not answer keeps
/// the runner from nothing but starting execs: its health says
/// `NOT_SERVING` until the engine answers (see [`engine_watch`]).
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let agent_socket = config.agent_socket()?;
    raise_open_files_limit();
    let state_dir = config.state_dir();
    std::fs::create_dir_all(&state_dir)
        .with_context(|| format!("cannot create {}", state_dir.display()))?;
    let operator =
        troupe_proto::paths::operator_token(config.operator_token.as_deref(), &config.data_dir)?;
    let registrar =
        register::Registrar::from_config(&config.registration, listener.local_addr()?, &operator)?;
    let tools_dir = match &config.tools_dir {
        Some(dir) => dir.clone(),
        None => install_tools(
            &std::env::current_exe().context("cannot find this binary")?,
            &state_dir.join("tools"),
        )?,
    };
    anyhow::ensure!(
        tools_dir.join(layout::SUPERVISOR).is_file(),
        "{} has no {}",
        tools_dir.display(),
        layout::SUPERVISOR
    );
    let socket = agent_socket.path().to_path_buf();
    let socket_dir = socket.parent().map(Path::to_path_buf);
    if let Some(dir) = &socket_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // Bound before any container can mount its directory.
    let relay = match agent_socket {
        AgentSocket::Local(_) => None,
        AgentSocket::Relayed { socket, upstreams } => Some(Relay::bind(
            &socket,
            upstreams,
            config.relay_max_connections as usize,
        )?),
    };
    let spec = ContainerSpec {
        image: config.image.clone(),
        network: config.network.clone(),
        pids_limit: config.pids_limit,
        memory_bytes: config.memory_mib * 1024 * 1024,
        workspace_gid: config.uid_base,
        tools_dir,
        name_prefix: config.container_prefix.clone(),
        session_socket_dir: socket_dir,
    };
    // An engine that does not answer yet keeps nothing from serving.
    let engine = Engine::connect(config.docker_host.clone(), spec).await;
    let socket_name = socket
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let cancel = CancellationToken::new();
    let runner = Runner::open(
        Settings {
            state_dir,
            workspaces_dir: config.workspaces_dir(),
            uid_base: config.uid_base,
            pids_limit: config.pids_limit,
            exec_pids_limit: config.exec_pids_limit,
            output_window: config.output_window_kib * 1024,
            logs: exec::LogLimits {
                per_exec: config.exec_log_max_mib << 20,
                total: config.logs_max_mib << 20,
                policy: config.exec_log_policy,
            },
            timeout_grace_ms: config.timeout_grace_ms,
            keep_exited: std::time::Duration::from_secs(config.keep_exited_secs),
            default_endpoint: Some(format!(
                "unix://{}/{socket_name}",
                layout::CONTAINER_SESSION_DIR
            )),
        },
        engine,
        cancel.clone(),
    )
    .await?;

    let health = tonic_health::server::HealthReporter::new();
    let drain = Drain::new(
        health.clone(),
        &[<RunnerServiceServer<Service> as tonic::server::NamedService>::NAME],
        cancel.clone(),
        std::time::Duration::from_millis(config.shutdown_drain_ms),
    );
    drain.serving().await;
    let relay = relay.map(|relay| {
        tokio::spawn(relay.run(
            cancel.clone(),
            std::time::Duration::from_millis(config.shutdown_drain_ms),
        ))
    });
    engine_watch::start(runner.clone(), health, cancel.clone()).await;
    let (reflection_v1, reflection_v1alpha) = troupe_proto::serving::reflection()?;

    tracing::info!(addr = %listener.local_addr()?, "runner listening");
    // Bounded as every listener; with TCP_NODELAY.
    let mut bounds = config.bounds.tcp();
    troupe_listen::Descriptors::raise(troupe_listen::descriptors::DEFAULT_RESERVE)
        .fit(&mut [("grpc", &mut bounds)]);
    let incoming =
        troupe_listen::BoundedTcp::new(listener, troupe_listen::Gate::new("grpc", bounds))
            .incoming();
    // The drain ends watch streams and followers; the execs themselves keep running.
    let server = tonic::transport::Server::builder()
        .trace_fn(troupe_telemetry::request_span)
        .http2_keepalive_interval(Some(troupe_listen::http::HTTP2_KEEPALIVE))
        .add_service(drain.health_service())
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(RunnerServiceServer::new(Service::new(runner, operator)))
        .serve_with_incoming_shutdown(incoming, cancel.clone().cancelled_owned());
    let stop = tokio::spawn({
        let drain = drain.clone();
        async move {
            shutdown.await;
            drain.begin().await;
        }
    });
    // Registered once the server is built, so the service finds it
    // serving; ended with the service (its lease then runs out).
    let registrar = registrar.map(|registrar| tokio::spawn(registrar.run(cancel.clone())));
    let served = drain.bounded(server).await;
    if let Some(task) = registrar {
        task.abort();
    }
    stop.abort();
    cancel.cancel();
    if let Some(relay) = relay {
        // Bounded by the drain time, which began with the cancel.
        let _ = relay.await;
    }
    served.unwrap_or(Ok(())).context("grpc server failed")
}

/// Every exec holds four descriptors while it is kept: allow what the
/// hard limit allows.
fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        tracing::warn!(error = %e, "cannot raise the open files limit");
    }
}

/// Tools copied into containers when they sit next to `troupe-runner`.
pub const AGENT_TOOLS: [&str; 2] = ["troupe-mcp", "troupe-demo-agent"];

/// Copies the `troupe-runner` binary `runner` into `dir` as the supervisor,
/// and the [`AGENT_TOOLS`] that sit next to it, so the tools in containers
/// match the runner.
pub fn install_tools(runner: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    install_file(runner, &dir.join(layout::SUPERVISOR))?;
    for tool in AGENT_TOOLS {
        if let Some(found) = runner.parent().map(|d| d.join(tool))
            && found.is_file()
        {
            install_file(&found, &dir.join(tool))?;
        }
    }
    Ok(dir.to_path_buf())
}

fn install_file(from: &Path, to: &Path) -> anyhow::Result<()> {
    let same = match (std::fs::read(from), std::fs::read(to)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same {
        return Ok(());
    }
    // A new file renamed into place: a running container keeps the old
    // inode. Named for this process, as other processes may install the
    // same tools at once (the tests and benches do, from several processes).
    let tmp = to.with_extension(format!("new.{}", std::process::id()));
    std::fs::copy(from, &tmp)
        .with_context(|| format!("cannot copy {} to {}", from.display(), tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, to)?;
    Ok(())
}
