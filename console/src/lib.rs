//! The web console: a live view of spawn trees for operators, served over
//! HTTP on a listener of its own (`--console-listen`) by the session
//! service, with its assets compiled in.
//!
//! - [`config`]: its flags.
//! - [`hosts`]: the `Host` names it answers to, the `Origin` it acts for.
//! - [`auth`]: signing in with the operator token, the cookie, CSRF.
//! - [`throttle`]: the bound on failed sign-ins, per client and in all.
//! - [`calls`]: acting through the service's own gRPC handlers, in process,
//!   as the operator; refusals as HTTP answers.
//! - [`api`]: the JSON API the page reads and acts through.
//! - [`pages`]: a workspace's sessions, all of them or a tree's snapshot a
//!   bounded page at a time.
//! - [`events`]: `WatchSessions` as Server-Sent Events.
//! - [`json`]: sessions, events, messages and audit entries as the page reads them.
//! - [`assets`]: the page (plain ES modules, no build step), and the
//!   headers every answer carries (the Content-Security-Policy first).
//!
//! The console decides nothing: each action is the gRPC call the CLI would
//! make, with the same rules, audit entries and events, and the console
//! adds an audit entry of its own (`console_*`) naming the sign-in it came
//! through.
//!
//! Its listener is bound before the database opens, like the gRPC one, and
//! the service's drain stops it: its event streams are `WatchSessions`
//! streams, ended by the drain's token, then the server waits for what is
//! still open.

mod api;
mod assets;
mod auth;
mod calls;
pub mod config;
mod events;
mod hosts;
mod json;
mod pages;
mod throttle;

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;

use axum::{
    Router,
    http::{HeaderValue, header},
    response::Response,
    routing::{get, post},
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use config::{ConsoleArgs, TraceUrl};

use troupe_domain::model::{AuditRecord, Principal};
use troupe_service::service::{Inner, Service};
use troupe_store::Store;

/// What the console was configured with.
#[derive(Clone, Debug)]
pub struct Settings {
    pub ttl: Duration,
    pub secure_cookie: bool,
    pub trace_url: Option<TraceUrl>,
    /// Failed sign-ins per minute: a client's, everyone's.
    pub sign_in_failures: (u32, u32),
    /// The `Host` names served.
    pub allowed_hosts: Arc<hosts::AllowedHosts>,
}

impl Settings {
    pub fn from_args(args: &ConsoleArgs) -> anyhow::Result<Settings> {
        Ok(Settings {
            ttl: args.session_ttl(),
            secure_cookie: args.console_secure_cookie,
            trace_url: args.trace_url()?,
            sign_in_failures: (
                args.console_sign_in_failures_per_minute,
                args.console_sign_in_global_failures_per_minute,
            ),
            allowed_hosts: Arc::new(hosts::AllowedHosts::new(&args.console_allowed_hosts)?),
        })
    }
}

/// The console's state: the service it acts through.
pub struct Console<S> {
    service: Service<S>,
    inner: Arc<Inner<S>>,
    settings: Settings,
    sign_ins: throttle::SignInThrottle,
}

impl<S: Store> Console<S> {
    pub fn new(service: Service<S>, settings: Settings) -> Arc<Self> {
        let (per_client, global) = settings.sign_in_failures;
        Arc::new(Console {
            inner: service.shared(),
            service,
            sign_ins: throttle::SignInThrottle::new(per_client, global),
            settings,
        })
    }

    /// The operator token, which the console's calls carry.
    fn operator_token(&self) -> &str {
        self.inner.tokens.operator()
    }

    async fn audit(&self, record: AuditRecord) {
        if let Err(e) = self.inner.store.append_audit(record).await {
            tracing::error!(error = %e, "audit append failed");
        }
    }

    /// The console's own audit entry of an action (`console_*`), beside the
    /// one the service's handler wrote: which sign-in it came through.
    async fn audit_console(
        &self,
        signed: &auth::Signed,
        action: troupe_domain::model::Action,
        target: &str,
        outcome: Result<(), &calls::ApiError>,
    ) {
        let (allowed, reason) = match outcome {
            Ok(()) => (true, "OK".to_owned()),
            Err(e) => (false, e.reason.clone().unwrap_or_else(|| e.code.to_owned())),
        };
        self.audit(AuditRecord {
            caller: Principal::Operator,
            action,
            target: target.to_owned(),
            allowed,
            reason,
            detail: format!("through the web console ({})", signed.label()),
        })
        .await;
    }
}

/// The console's routes, each behind the check of `Host` and `Origin`.
pub fn router<S: Store>(console: Arc<Console<S>>) -> Router {
    let allowed = console.settings.allowed_hosts.clone();
    Router::new()
        .route("/api/sign-in", post(auth::sign_in::<S>))
        .route("/api/sign-out", post(auth::sign_out::<S>))
        .route("/api/session", get(auth::session::<S>))
        .route("/api/workspaces", get(api::workspaces::<S>))
        .route("/api/workspaces/{workspace}/sessions", get(api::tree::<S>))
        .route("/api/agents", get(api::agents::<S>))
        .route("/api/refused", get(api::refused::<S>))
        .route("/api/sessions", post(api::create_root::<S>))
        .route("/api/sessions/{id}", get(api::session::<S>))
        .route("/api/sessions/{id}/messages", post(api::send::<S>))
        .route("/api/sessions/{id}/terminate", post(api::terminate::<S>))
        .route("/api/events", get(events::stream::<S>))
        .merge(assets::routes())
        .layer(axum::middleware::from_fn_with_state(allowed, hosts::guard))
        .layer(axum::middleware::map_response(assets::secure_headers))
        .with_state(console)
}

/// The console's listener, bound with its settings checked.
pub struct Listener {
    listener: TcpListener,
    settings: Settings,
}

impl Listener {
    pub async fn bind(addr: SocketAddr, args: &ConsoleArgs) -> anyhow::Result<Listener> {
        let settings = Settings::from_args(args)?;
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} for the console"))?;
        tracing::info!(addr = %listener.local_addr()?, "console listening");
        Ok(Listener { listener, settings })
    }

    /// Serves the console through `service` until `stop` is cancelled (the
    /// drain's token: open event streams end with the service's watches,
    /// then the server waits for what is still open).
    pub fn serve<S: Store>(
        self,
        service: Service<S>,
        stop: CancellationToken,
        gate: troupe_listen::Gate,
    ) -> impl Future<Output = std::io::Result<()>> + Send {
        let router = router(Console::new(service, self.settings));
        // Each request carries the client's address (`ConnectInfo`): sign-in
        // failures are counted by it.
        troupe_listen::http::serve(
            troupe_listen::BoundedTcp::new(self.listener, gate),
            router,
            stop.cancelled_owned(),
        )
    }
}

/// Marks an API answer as never to be cached.
fn no_store(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
