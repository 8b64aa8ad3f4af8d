//! The model gateway: the Anthropic Messages API (`POST /v1/messages`,
//! `POST /v1/messages/count_tokens`) and OpenAI Chat Completions
//! (`POST /v1/chat/completions`), served over HTTP/1.1 on the session
//! service's own listeners. An agent's key is its session token; the call is
//! the token's session's, checked like every call ([`identify`]), and goes
//! upstream with the provider's key in place of the agent's.
//!
//! Before a call goes out, its worst case is reserved against the budgets
//! of the session's path ([`policy::admit_charge`]); the provider's own
//! usage settles it ([`usage`]), whatever way the call ends ([`forward`]).
//!
//! - [`config`]: providers, keys, prices, access, timeouts.
//! - [`shape`]: errors in each API's own shape.
//! - [`usage`]: usage as the provider reports it, streaming or not.
//! - [`forward`]: the upstream call, its answer, settlement.
//! - [`relay`]: a streamed answer passed on frame by frame, metered.
//! - [`tls`]: the roots a provider's certificate is checked against.

pub mod config;
pub mod forward;
mod relay;
pub mod shape;
pub mod tls;
pub mod usage;

use std::{collections::HashMap, sync::Arc};

use axum::{
    Router,
    body::Bytes,
    extract::{DefaultBodyLimit, State},
    http::{HeaderMap, Uri},
    response::Response,
    routing::post,
};
use serde_json::Value;

use self::{
    config::{GatewayConfig, ProviderKind},
    forward::{Call, Client},
    shape::{Api, ApiError, Kind},
};
use crate::{
    error::{Reason, SessionError},
    model::{AuditRecord, Caller, Principal, SessionRow, now_ms},
    policy,
    service::{Inner, identity::identify},
    store::Store,
};

/// Largest request body the gateway takes (a long conversation).
const MAX_BODY_BYTES: usize = 64 << 20;

/// What the routes share.
pub struct Gateway<S> {
    inner: Arc<Inner<S>>,
    config: Option<Arc<GatewayConfig>>,
    /// One per provider, by name: each trusts its own `ca_file`.
    clients: HashMap<String, Client>,
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
        })
    }

    /// The gateway's routes.
    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/v1/messages", post(messages::<S>))
            .route("/v1/messages/count_tokens", post(count_tokens::<S>))
            .route("/v1/chat/completions", post(chat::<S>))
            .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
            .with_state(self)
    }
}

async fn messages<S: Store + Clone + 'static>(
    State(gw): State<Arc<Gateway<S>>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    gw.serve(Api::Anthropic, false, uri, headers, body).await
}

async fn count_tokens<S: Store + Clone + 'static>(
    State(gw): State<Arc<Gateway<S>>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    gw.serve(Api::Anthropic, true, uri, headers, body).await
}

async fn chat<S: Store + Clone + 'static>(
    State(gw): State<Arc<Gateway<S>>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    gw.serve(Api::Openai, false, uri, headers, body).await
}

/// The agent's key: `x-api-key`, else `Authorization: Bearer`.
fn token_of(headers: &HeaderMap) -> Option<&str> {
    let key = headers
        .get("x-api-key")
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
        api: Api,
        count_only: bool,
        uri: Uri,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response {
        let action = match (api, count_only) {
            (Api::Anthropic, false) => "model_call",
            (Api::Anthropic, true) => "count_tokens",
            (Api::Openai, _) => "model_call",
        };
        let session = match self.caller(&headers, action).await {
            Ok(session) => session,
            Err(e) => return e.response(api),
        };
        let prepared = self.prepare(api, count_only, &uri, headers, body, &session);
        let call = match prepared {
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
        if count_only {
            return forward::count_tokens(client, call).await;
        }
        let worst = call.worst;
        let reserved = self
            .inner
            .store
            .reserve(&session.session_id, worst, &|row, path| {
                policy::admit_charge(row, path, &worst, now_ms())
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

    /// The session calling, from its token (`401` in the API's shape
    /// otherwise); refusals audited with the reason the gRPC side gives
    /// the same token (`TOKEN_MISSING`, `TOKEN_INVALID`, `TOKEN_EXPIRED`,
    /// `TOKEN_REVOKED`; `SESSION_ONLY` for the operator's).
    async fn caller(
        &self,
        headers: &HeaderMap,
        action: &'static str,
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

    /// Checks the request and decides where it goes and what it may cost.
    fn prepare(
        &self,
        api: Api,
        count_only: bool,
        uri: &Uri,
        headers: HeaderMap,
        body: Bytes,
        session: &SessionRow,
    ) -> Result<Call, ApiError> {
        let mut json: Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::new(Kind::Invalid, format!("the body is not JSON: {e}")))?;
        let model = json
            .get("model")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::new(Kind::Invalid, "model: a string is required"))?
            .to_owned();
        let Some(config) = &self.config else {
            return Err(ApiError::new(
                Kind::Forbidden,
                format!("model {model:?} is not served: the gateway has no providers configured"),
            ));
        };
        let workspace = &session.workspace_id;
        let entry = match config.models.get(&model) {
            Some(entry) if config.allows(workspace, &model) => entry.clone(),
            _ => {
                return Err(ApiError::new(
                    Kind::Forbidden,
                    format!("model {model:?} is not available to workspace {workspace}"),
                ));
            }
        };
        let provider = config.providers[entry.provider].clone();
        let expected = match api {
            Api::Anthropic => ProviderKind::Anthropic,
            Api::Openai => ProviderKind::Openai,
        };
        if provider.kind != expected {
            return Err(ApiError::new(
                Kind::Invalid,
                format!(
                    "model {model:?} is served by an {} provider: call its API",
                    provider.kind.as_str()
                ),
            ));
        }
        let stream = json.get("stream").and_then(Value::as_bool) == Some(true);
        let max_tokens = match api {
            Api::Anthropic => json.get("max_tokens").and_then(Value::as_u64),
            Api::Openai => json
                .get("max_completion_tokens")
                .or_else(|| json.get("max_tokens"))
                .and_then(Value::as_u64),
        };
        let max_tokens = match (max_tokens, api) {
            (Some(n), _) => n,
            (None, _) if count_only => 0,
            (None, Api::Anthropic) => {
                return Err(ApiError::new(
                    Kind::Invalid,
                    "max_tokens: a number is required",
                ));
            }
            (None, Api::Openai) => {
                // The call's worst case needs a bound: the model's.
                let n = entry.max_output_tokens;
                json["max_completion_tokens"] = Value::from(n);
                n
            }
        };
        let body = if api == Api::Openai {
            if stream {
                json["stream_options"] = serde_json::json!({"include_usage": true});
            }
            Bytes::from(json.to_string())
        } else {
            body
        };
        let worst = entry
            .price
            .worst_case(body.len() as u64, max_tokens)
            .ok_or_else(|| ApiError::new(Kind::Invalid, "max_tokens: too large"))?;
        Ok(Call {
            api,
            provider,
            model,
            price: entry.price,
            timeouts: config.timeouts,
            path_and_query: uri
                .path_and_query()
                .map(|p| p.as_str().to_owned())
                .unwrap_or_else(|| uri.path().to_owned()),
            headers,
            body,
            worst,
            session_id: session.session_id.clone(),
            workspace_id: session.workspace_id.clone(),
            agent: session.agent_name.clone(),
            life: session.trace,
        })
    }

    async fn audit(
        &self,
        session: &SessionRow,
        action: &'static str,
        allowed: bool,
        reason: String,
        detail: &str,
    ) {
        self.append(AuditRecord {
            caller: Principal::Session(session.session_id.clone()),
            action,
            target: session.session_id.clone(),
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

/// The audit reason of a gateway refusal.
fn kind_reason(e: &ApiError) -> String {
    match e.kind {
        Kind::Invalid => "INVALID_ARGUMENT",
        Kind::Unauthenticated => "UNAUTHENTICATED",
        Kind::Forbidden => "MODEL_NOT_ALLOWED",
        Kind::Budget => "BUDGET_EXCEEDED",
        Kind::Upstream | Kind::Timeout | Kind::Internal => "UPSTREAM",
    }
    .to_owned()
}
