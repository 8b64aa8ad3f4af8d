//! Troupe's session service: the spawn-tree ledger and every rule of it,
//! served over gRPC as `troupe.session.v1.SessionService`.
//!
//! The binary composes the session service's crates, re-exported here
//! under their module names:
//! - [`config`]: flags, `TROUPE_*` variables and spawn limits; [`health`]:
//!   health that follows the database. These two are this crate's own.
//! - [`model`], [`policy`] (every rule, as pure functions), [`placement`],
//!   [`error`] (the error table): `troupe-domain`.
//! - [`store`]: the storage interface and its SQLite and PostgreSQL
//!   implementations: `troupe-store`.
//! - [`service`] (the gRPC handlers), [`driver`], [`owner`], [`auth`],
//!   [`operator`], [`rules`], [`agents`], [`lives`], [`metrics`]:
//!   `troupe-service`.
//! - [`gateway`]: the model gateway's HTTP routes: `troupe-gateway`.
//! - [`console`]: the web console (`--console-listen`): `troupe-console`.
//!
//! [`serve`] runs the whole service on a listener the caller bound: it opens
//! the store, settles the operator token with it, loads the signing keys,
//! starts the background work's lease ([`owner`]) and the store's own upkeep
//! ([`upkeep`]: `UpkeepStore::maintain` every second), and serves `SessionService`,
//! `FleetService`, health and reflection, with the gateway's routes, on TCP
//! and on `<data-dir>/run/session.sock` (mode 0666; none with `--socket
//! none`), and the console on a listener of its own.

pub mod config;
pub mod health;

pub use troupe_console as console;
pub use troupe_domain::{cursor, error, model, placement, policy, shard};
pub use troupe_gateway as gateway;
pub use troupe_service::{agents, auth, driver, lives, metrics, operator, owner, rules, service};
pub use troupe_store as store;

use std::{future::Future, time::Duration};

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use troupe_listen::{BoundedTcp, BoundedUnix, Descriptors, Gate};
use troupe_proto::{
    drain::Drain, fleet::fleet_service_server::FleetServiceServer,
    session::session_service_server::SessionServiceServer,
};

pub use config::{Config, Limits, MessageLimits};

use crate::{
    auth::Tokens,
    driver::Driver,
    service::{Finishing, Inner, Service},
    store::{Holder, PgStore, SqliteStore, prelude::*},
};

/// How often the store does its upkeep ([`UpkeepStore::maintain`]).
const MAINTAIN_EVERY: Duration = Duration::from_secs(1);

/// Serves the session service on `listener` until `shutdown` completes.
///
/// Opens (and migrates) the database, loads or creates the token signing
/// key, settles the operator token with the database ([`operator::settle`]),
/// then serves `SessionService`, `FleetService`, gRPC health
/// and server reflection (v1 and v1alpha), and over HTTP/1.1 as well the
/// model gateway's routes ([`gateway`]).
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // A bad gateway or console configuration refuses the start before anything else.
    let gateway = config.gateway()?;
    // Bound first, like the gRPC listener: a browser's first request waits
    // in the backlog until the console serves.
    let console = match config.console.console_listen {
        Some(addr) => Some(console::Listener::bind(addr, &config.console).await?),
        None => None,
    };
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
    let url = config.database_url();
    if store::is_postgres_url(&url) {
        let store = PgStore::open(&url)
            .await
            .with_context(|| format!("cannot open database {}", store::redacted_url(&url)))?
            .with_output_budget(config.output_budget());
        let operator =
            operator::settle(&store, config.operator_token.as_deref(), &config.data_dir).await?;
        let tokens = Tokens::load(&store, operator, config.token_ttl()).await?;
        return serve_with_store(config, gateway, store, tokens, listener, console, shutdown).await;
    }
    anyhow::ensure!(
        url.starts_with("sqlite:"),
        "unsupported database url {:?}: use sqlite://PATH or postgres://USER:PASSWORD@HOST/DB",
        store::redacted_url(&url)
    );
    let store = SqliteStore::open(&url)
        .await
        .with_context(|| format!("cannot open database {url}"))?
        .with_output_budget(config.output_budget());
    let operator =
        operator::settle(&store, config.operator_token.as_deref(), &config.data_dir).await?;
    let tokens = Tokens::load(&store, operator, config.token_ttl()).await?;
    serve_with_store(config, gateway, store, tokens, listener, console, shutdown).await
}

async fn serve_with_store<S: Store + Clone + 'static>(
    config: Config,
    gateway: Option<gateway::config::GatewayConfig>,
    store: S,
    tokens: Tokens,
    listener: TcpListener,
    console: Option<console::Listener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // A SQLite service is alone on its database: its own limits win there.
    let replicated = store::is_postgres_url(&config.database_url());
    let rules = rules::settle(
        &store,
        config.limit_set(),
        config.adopt_limits || !replicated,
    )
    .await?;
    let cancel = CancellationToken::new();
    let timing = config.lease_timing()?;
    let agent_files = config.definition_files();
    for left in agent_files.all_misplaced() {
        tracing::warn!(
            file = %left.display(),
            agents_dir = %agent_files.agents_dir.display(),
            "agent definition in the workspaces directory, where agents can write it: never run; move it to the agents directory (docs/agents.md)"
        );
    }
    // Sessions that end from here on (reconciliation included) are traced.
    let lives_from = store.event_heads().await?.live(shard::ShardSet::ALL);
    let tokens = std::sync::Arc::new(tokens);
    let embedded = config.embedded_runner()?;
    let driver = Driver::new(
        store.clone(),
        tokens.clone(),
        embedded,
        store::is_postgres_url(&config.database_url()),
        tokens.operator(),
        config.output_tail_bytes,
        config.start_deadline(),
    )?;
    // Every service takes its share of the background work, shard by shard
    // (their leases): a SQLite service is alone on its database, so it
    // holds every shard; replicas on PostgreSQL divide them. A shard's
    // holder drives its workspaces' agents on the runners (the embedded one,
    // `--runner`, and those that register); the fleet shard's also prunes
    // and exports (docs/operating.md).
    let owner = {
        let work = owner::Work {
            store: store.clone(),
            driver: driver.clone(),
            timing,
            keep: config.event_retention,
            request_ids: config.request_id_retention(),
            lives_from: Some(lives_from),
        };
        let holder = Holder::generate();
        tracing::info!(%holder, "this service's name as a holder of shards");
        let first = owner::first_try(&work, &holder).await;
        tokio::spawn(owner::run(work, holder, first, cancel.clone()))
    };
    let service = Service::new(Inner {
        store: store.clone(),
        tokens,
        rules: rules.clone(),
        workspaces_dir: config.workspaces_dir(),
        agent_files,
        shutdown: cancel.clone(),
        driver: Some(driver),
        request_id_retention: config.request_id_retention(),
        finishing: Finishing {
            max_result_bytes: config.max_result_bytes,
            grace: Duration::from_millis(config.finish_grace_ms),
        },
    });
    metrics::observe_active(store.clone());
    if replicated {
        // Replicas: a limit another one adopted is in force here too.
        tokio::spawn(rules::follow(store.clone(), rules, cancel.clone()));
    }
    let upkeep = tokio::spawn(upkeep(store.clone(), cancel.clone()));

    let service_name = <SessionServiceServer<Service<S>> as tonic::server::NamedService>::NAME;
    let fleet_name = <FleetServiceServer<Service<S>> as tonic::server::NamedService>::NAME;
    let drain = Drain::new(
        tonic_health::server::HealthReporter::new(),
        &[service_name, fleet_name],
        cancel.clone(),
        config.shutdown_drain(),
    );
    drain.serving().await;
    // Health follows the database; while it cannot be reached, calls fail fast.
    let reachable = health::Reachable::default();
    tokio::spawn(health::follow(
        store.clone(),
        drain.clone(),
        reachable.clone(),
        cancel.clone(),
    ));
    let (reflection_v1, reflection_v1alpha) = troupe_proto::serving::reflection()?;

    let mut routes = tonic::service::Routes::builder();
    routes
        .add_service(drain.health_service())
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(SessionServiceServer::new(service.clone()))
        .add_service(FleetServiceServer::new(service.clone()));
    // Each listener's connections are bounded, within its share of the
    // descriptors (docs/security.md, "Bounds on every listener").
    let descriptors = Descriptors::raise(troupe_listen::descriptors::DEFAULT_RESERVE);
    let mut grpc_bounds = config.bounds.tcp();
    let mut agents_bounds = config.bounds.agents();
    let mut console_bounds = config.bounds.tcp();
    {
        let mut listeners: Vec<(&'static str, &mut troupe_listen::Bounds)> =
            vec![("grpc", &mut grpc_bounds)];
        if config.socket().is_some() {
            listeners.push(("agents", &mut agents_bounds));
        }
        if console.is_some() {
            listeners.push(("console", &mut console_bounds));
        }
        descriptors.fit(&mut listeners);
    }
    let console = console.map(|console| {
        console.serve(
            service.clone(),
            cancel.clone(),
            Gate::new("console", console_bounds),
        )
    });
    let gateway = gateway::Gateway::new(service.shared(), gateway).router();
    let routes = tonic::service::Routes::from(routes.routes().into_axum_router().merge(gateway));

    // Both servers stop accepting when the drain begins.
    let unix = match config.socket() {
        Some(path) => {
            let listener = bind_unix(&path)?;
            tracing::info!(socket = %path.display(), "session service listening");
            let stream = BoundedUnix::new(listener, Gate::new("agents", agents_bounds)).incoming();
            Some(
                tonic::transport::Server::builder()
                    .accept_http1(true)
                    .trace_fn(request_span)
                    .http2_keepalive_interval(Some(troupe_listen::http::HTTP2_KEEPALIVE))
                    .layer(health::FailFast(reachable.clone()))
                    .add_routes(routes.clone())
                    .serve_with_incoming_shutdown(stream, cancel.clone().cancelled_owned()),
            )
        }
        None => None,
    };
    tracing::info!(addr = %listener.local_addr()?, "session service listening");
    // With TCP_NODELAY (small HTTP/2 frames would wait out delayed ACKs).
    let incoming = BoundedTcp::new(listener, Gate::new("grpc", grpc_bounds)).incoming();
    let tcp = tonic::transport::Server::builder()
        .accept_http1(true)
        .trace_fn(request_span)
        .http2_keepalive_interval(Some(troupe_listen::http::HTTP2_KEEPALIVE))
        .layer(health::FailFast(reachable))
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, cancel.clone().cancelled_owned());
    let stop = tokio::spawn({
        let drain = drain.clone();
        async move {
            shutdown.await;
            drain.begin().await;
        }
    });
    let served = drain
        .bounded(async {
            let unix = async {
                match unix {
                    Some(server) => server
                        .await
                        .context("grpc server on the unix socket failed"),
                    None => Ok(()),
                }
            };
            let console = async {
                match console {
                    Some(server) => server.await.context("console server failed"),
                    None => Ok(()),
                }
            };
            let (tcp, unix, console) = tokio::join!(tcp, unix, console);
            tcp.context("grpc server failed").and(unix).and(console)
        })
        .await;
    stop.abort();
    cancel.cancel();
    let _ = upkeep.await;
    let _ = owner.await;
    served.unwrap_or(Ok(()))
}

/// Binds the Unix socket, replacing a stale one, connectable by every uid:
/// agents run under uids of their own, and every call needs a token anyway.
fn bind_unix(path: &std::path::Path) -> anyhow::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => anyhow::bail!("{} exists and is not a socket", path.display()),
        Err(_) => {}
    }
    let listener = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("cannot listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(listener)
}

/// Runs the backend's own upkeep until `cancel` (every [`MAINTAIN_EVERY`];
/// SQLite's returns freed space and checkpoints), in every service: it
/// writes nothing of the ledger. Pruning is the background work's
/// ([`owner`]).
pub async fn upkeep<S: Store>(store: S, cancel: CancellationToken) {
    let mut maintain = tokio::time::interval(MAINTAIN_EVERY);
    loop {
        tokio::select! {
            _ = maintain.tick() => {
                if let Err(e) = store.maintain().await {
                    tracing::warn!(error = %e, "database upkeep failed");
                }
            }
            () = cancel.cancelled() => return,
        }
    }
}

/// The span a request is served in: the spawns make their own (their spawn
/// span is the request's span, one span where there would be two); every
/// other call gets [`troupe_telemetry::request_span`].
fn request_span(request: &tonic::codegen::http::Request<()>) -> tracing::Span {
    if service::makes_own_span(request.uri().path()) {
        tracing::Span::none()
    } else {
        troupe_telemetry::request_span(request)
    }
}
