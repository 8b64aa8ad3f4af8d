//! The model gateway: the Anthropic Messages API (`POST /v1/messages`,
//! `POST /v1/messages/count_tokens`), OpenAI Chat Completions
//! (`POST /v1/chat/completions`) and Responses (`POST /v1/responses`, as
//! Codex calls it; a WebSocket upgrade there is a `404` like any other
//! method, and the client falls back to HTTP), and Gemini's
//! (`POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent`
//! as server-sent events, `:countTokens`, as Gemini CLI calls them), served over HTTP/1.1 on the session
//! service's own listeners. An agent's key is its session token; the call is
//! the token's session's, checked like every call ([`identify`]), and goes
//! upstream with the provider's key in place of the agent's.
//!
//! Before a call goes out, its worst case is reserved against the budgets
//! of the session's path ([`policy::admit_charge`]); the provider's own
//! usage settles it ([`usage`]), whatever way the call ends ([`forward`]).
//!
//! The provider boundary is an allowlist each way: the request headers
//! and query sent on ([`headers`], [`prepare`]), what a body may make the
//! provider do ([`reach`]), and the answer's headers relayed, its key
//! scrubbed from all it says ([`scrub`]). A request's token is checked from
//! its headers before its body is read, and the body is bounded ([`body`]).
//! Any other path or method under `/v1/` is a `404` in the API's shape (not
//! the gRPC fallback's empty 200). `count_tokens` reserves one call of no
//! tokens, so it is refused once any budget of the path is spent. Refusals
//! are audited: a token's with the reason the gRPC side gives the same
//! token, as `identify` audits a gRPC call's.
//!
//! - [`config`]: providers, keys, prices, access, timeouts.
//! - [`shape`]: errors in each API's own shape.
//! - [`body`]: a request's body, bounded.
//! - [`strict`]: JSON with no key given twice.
//! - [`prepare`]: a request checked and made a call; its worst case.
//! - [`reach`]: server tools, MCP servers and remote content refused.
//! - [`headers`]: the headers that cross, each way.
//! - [`scrub`]: the provider's key out of what it says.
//! - [`usage`]: usage as the provider reports it, streaming or not.
//! - [`meter`]: a stream of server-sent events read as it passes.
//! - [`forward`]: the upstream call, its answer.
//! - [`settle`]: a call's reservation settled exactly once.
//! - [`relay`]: a streamed answer passed on frame by frame, metered.
//! - [`tls`]: the roots a provider's certificate is checked against.

mod body;
pub mod config;
mod forward;
mod headers;
mod meter;
mod prepare;
mod reach;
mod relay;
mod scrub;
mod settle;
mod shape;
mod strict;
mod tls;
mod usage;

use std::{collections::HashMap, sync::Arc};

use axum::{
    Router,
    body::Body,
    extract::{Path, Request, State},
    http::{HeaderMap, Method},
    response::Response,
    routing::{any, post},
};

use self::{
    config::GatewayConfig,
    forward::Client,
    prepare::{Route, Target},
    shape::{Api, ApiError, Kind},
};
use troupe_domain::{
    error::{Reason, SessionError},
    model::{Account, AuditRecord, Caller, Charge, Cost, Principal, SessionRow, now_ms},
    policy,
};
use troupe_service::service::{Inner, identity::identify};
use troupe_store::Store;

/// What the routes share.
pub struct Gateway<S> {
    inner: Arc<Inner<S>>,
    config: Option<Arc<GatewayConfig>>,
    /// One per provider, by name: each trusts its own `ca_file`.
    clients: HashMap<String, Client>,
    /// The bytes of requests held, by session and in all.
    inflight: Arc<body::InFlight>,
}

impl<S: Store + Clone + 'static> Gateway<S> {
    /// A gateway over the service's state; with no `config`, every model
    /// call is refused as not served.
    pub fn new(inner: Arc<Inner<S>>, config: Option<GatewayConfig>) -> Arc<Gateway<S>> {
        let clients = config
            .iter()
            .flat_map(|c| {
                let connect = c.timeouts.connect;
                c.providers
                    .iter()
                    .map(move |p| (p.name.clone(), forward::client(connect, &p.extra_roots)))
            })
            .collect();
        Arc::new(Gateway {
            inner,
            config: config.map(Arc::new),
            clients,
            inflight: Arc::default(),
        })
    }

    /// The gateway's routes.
    pub fn router(self: Arc<Self>) -> Router {
        // Any other path under /v1, or method, is no route of the gateway's
        // (gRPC's paths are /package.Service/Method): 404 in the API's shape,
        // not the gRPC fallback's empty 200.
        Router::new()
            .route("/v1/messages", post(messages::<S>).fallback(not_found))
            .route(
                "/v1/messages/count_tokens",
                post(count_tokens::<S>).fallback(not_found),
            )
            .route("/v1/chat/completions", post(chat::<S>).fallback(not_found))
            .route("/v1/responses", post(responses::<S>).fallback(not_found))
            .route(
                "/v1beta/models/{target}",
                post(gemini::<S>).fallback(not_found),
            )
            .route("/v1/{*rest}", any(not_found))
            .route("/v1beta/{*rest}", any(not_found))
            .with_state(self)
    }
}

async fn messages<S: Store + Clone + 'static>(
    State(gw): State<Arc<Gateway<S>>>,
    request: Request,
) -> Response {
    gw.serve(Route::Messages, None, request).await
}

async fn count_tokens<S: Store + Clone + 'static>(
    State(gw): State<Arc<Gateway<S>>>,
    request: Request,
) -> Response {
    gw.serve(Route::CountTokens, None, request).await
}

async fn chat<S: Store + Clone + 'static>(
    State(gw): State<Arc<Gateway<S>>>,
    request: Request,
) -> Response {
    gw.serve(Route::Chat, None, request).await
}

async fn responses<S: Store + Clone + 'static>(
    State(gw): State<Arc<Gateway<S>>>,
    request: Request,
) -> Response {
    gw.serve(Route::Responses, None, request).await
}

/// `{model}:{method}`: a Gemini method of a model.
async fn gemini<S: Store + Clone + 'static>(
    State(gw): State<Arc<Gateway<S>>>,
    Path(target): Path<String>,
    method: Method,
    request: Request,
) -> Response {
    let route = target
        .rsplit_once(':')
        .and_then(|(model, name)| Some((model, Route::gemini(name)?)));
    match route {
        Some((model, route)) if !model.is_empty() => {
            let model = model.to_owned();
            gw.serve(route, Some(model), request).await
        }
        _ => not_found(method, request).await,
    }
}

/// A path or method the gateway does not serve: `404` in the shape of the
/// API the client speaks (Gemini's under `/v1beta/`; Anthropic's if it
/// sends `anthropic-version` or an `x-api-key`, or calls under
/// `/v1/messages`; OpenAI's otherwise).
async fn not_found(method: Method, request: Request) -> Response {
    let headers = request.headers();
    let path = request.uri().path();
    let anthropic = headers.contains_key("anthropic-version")
        || headers.contains_key("x-api-key")
        || path.starts_with("/v1/messages");
    let api = if path.starts_with("/v1beta/") {
        Api::Gemini
    } else if anthropic {
        Api::Anthropic
    } else {
        Api::Openai
    };
    let shown: String = path.chars().take(200).filter(|c| !c.is_control()).collect();
    ApiError::new(
        Kind::NotFound,
        format!("no route {method} {shown}: the gateway serves POST /v1/messages, /v1/messages/count_tokens, /v1/chat/completions, /v1/responses and /v1beta/models/MODEL:generateContent, :streamGenerateContent, :countTokens"),
    )
    .response(api)
}

/// The agent's key: `x-api-key` (Anthropic's) or `x-goog-api-key`
/// (Gemini's), else `Authorization: Bearer`.
fn token_of(headers: &HeaderMap) -> Option<&str> {
    let key = ["x-api-key", "x-goog-api-key"]
        .into_iter()
        .find_map(|name| headers.get(name))
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    let bearer = || {
        let value = headers.get("authorization")?.to_str().ok()?;
        value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .map(str::trim)
    };
    key.or_else(bearer).filter(|t| !t.is_empty())
}

impl<S: Store + Clone + 'static> Gateway<S> {
    async fn serve(
        self: Arc<Self>,
        route: Route,
        model: Option<String>,
        request: Request,
    ) -> Response {
        let (api, action) = (route.api(), route.action());
        let (parts, body) = request.into_parts();
        // The token first, from the headers: nobody else's body is read.
        let session = match self.caller(&parts.headers, action).await {
            Ok(session) => session,
            Err(e) => return e.response(api),
        };
        let target = Target {
            route,
            model: model.as_deref(),
            query: parts.uri.query(),
        };
        let call = match self.checked(target, parts.headers, body, &session).await {
            Ok(call) => call,
            Err(e) => {
                self.audit(&session, action, false, kind_reason(&e), &e.message)
                    .await;
                return e.response(api);
            }
        };
        let Some(client) = self.clients.get(&call.provider.name).cloned() else {
            tracing::error!(provider = %call.provider.name, "no client for a provider");
            return ApiError::new(Kind::Internal, "internal error of the gateway").response(api);
        };
        let worst = call.worst;
        let reserved = self
            .inner
            .store
            .reserve(&session.session_id, worst, &|row, path| {
                admit(route, row, path, &worst)
            })
            .await;
        let reservation = match reserved {
            Ok(r) => r,
            Err(e) => {
                let reason = e.reason().as_str().to_owned();
                self.audit(&session, action, false, reason, &e.to_string())
                    .await;
                if matches!(e, SessionError::Storage(_) | SessionError::Internal(_)) {
                    tracing::error!(error = %e, "cannot reserve a model call");
                }
                return ApiError::from_session(&e).response(api);
            }
        };
        // Spawned, so that a client that hangs up does not cut the call
        // short of its settlement.
        let store = self.inner.store.clone();
        let answer = tokio::spawn(forward::run(client, store, call, reservation));
        match answer.await {
            Ok(response) => response,
            Err(e) => {
                tracing::error!(error = %e, "model call task failed");
                ApiError::new(Kind::Internal, "internal error of the gateway").response(api)
            }
        }
    }

    /// The request's body, read within its bounds, checked and made a call
    /// that holds the body's count in flight.
    async fn checked(
        &self,
        target: Target<'_>,
        headers: HeaderMap,
        body: Body,
        session: &SessionRow,
    ) -> Result<forward::Call, ApiError> {
        let mut held = self.inflight.hold(&session.session_id);
        let config = self.config.as_deref();
        let idle = config.map(|c| c.timeouts).unwrap_or_default().body;
        let bytes = body::read(&headers, body, &mut held, idle).await?;
        let call = prepare::prepare(config, target, headers, bytes, session)?;
        Ok(forward::Call {
            _held: Some(held),
            ..call
        })
    }

    /// The session calling, from its token (`401` in the API's shape
    /// otherwise); refusals audited with the reason the gRPC side gives
    /// the same token (`TOKEN_MISSING`, `TOKEN_INVALID`, `TOKEN_EXPIRED`,
    /// `TOKEN_REVOKED`; `SESSION_ONLY` for the operator's).
    async fn caller(
        &self,
        headers: &HeaderMap,
        action: troupe_domain::model::Action,
    ) -> Result<SessionRow, ApiError> {
        let identified = match token_of(headers) {
            None => Err(SessionError::refused(
                Reason::TokenMissing,
                "missing credentials: send the session's token as the API key (x-api-key or Authorization: Bearer)",
            )),
            Some(token) => match identify(&self.inner, token).await {
                Ok((Caller::Session(row), _)) => Ok(*row),
                Ok((Caller::Operator, _)) => Err(SessionError::refused(
                    Reason::SessionOnly,
                    "the operator token makes no model calls: a model call is a session's, made with its token",
                )),
                Err(e) => Err(e),
            },
        };
        let e = match identified {
            Ok(row) => return Ok(row),
            Err(e) => e,
        };
        self.append(AuditRecord {
            caller: Principal::Anonymous,
            action,
            target: String::new(),
            allowed: false,
            reason: e.reason().as_str().to_owned(),
            detail: e.to_string(),
        })
        .await;
        Err(ApiError::from_session(&e))
    }

    async fn audit(
        &self,
        session: &SessionRow,
        action: troupe_domain::model::Action,
        allowed: bool,
        reason: String,
        detail: &str,
    ) {
        self.append(AuditRecord {
            caller: Principal::Session(session.session_id.clone()),
            action,
            target: session.session_id.to_string(),
            allowed,
            reason,
            detail: detail.to_owned(),
        })
        .await;
    }

    async fn append(&self, record: AuditRecord) {
        if let Err(e) = self.inner.store.append_audit(record).await {
            tracing::error!(error = %e, "audit append failed");
        }
    }
}

/// Admits a call's reservation of `worst` on the budgets of `path`. A
/// `count_tokens` generates nothing (it reserves one call of no tokens),
/// but is refused once any budget of the path is spent: it needs a unit of
/// every dimension left.
fn admit(
    route: Route,
    row: &SessionRow,
    path: &[Account],
    worst: &Charge,
) -> Result<(), SessionError> {
    const UNIT: Charge = Charge {
        cost: Cost(1),
        tokens: 1,
        calls: 1,
    };
    let asked = if route.counts_tokens() { &UNIT } else { worst };
    policy::admit_charge(row, path, asked, now_ms())
}

/// The audit reason of a gateway refusal.
fn kind_reason(e: &ApiError) -> String {
    match e.kind {
        Kind::Invalid => "INVALID_ARGUMENT",
        Kind::Unauthenticated => "UNAUTHENTICATED",
        Kind::Forbidden => "MODEL_NOT_ALLOWED",
        Kind::NotFound => "NOT_FOUND",
        Kind::TooLarge => "TOO_LARGE",
        Kind::Busy => "BUSY",
        Kind::Budget => "BUDGET_EXCEEDED",
        Kind::Upstream | Kind::Timeout | Kind::Internal => "UPSTREAM",
    }
    .to_owned()
}
