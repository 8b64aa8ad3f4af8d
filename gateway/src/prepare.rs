//! A request checked and made a [`Call`]: its body read as every reader
//! reads it ([`strict`]), its model served to the caller's workspace by a
//! provider of the route's API, what it may make the provider do
//! ([`reach`]), and its worst case: every completion it asks for (OpenAI's
//! `n`) at its output bound, plus its bytes as input. A call with no output
//! bound where the API allows none (Chat Completions, Responses) is given
//! its model's. The upstream path carries no query but Anthropic's
//! `beta=true`.

use axum::{body::Bytes, http::HeaderMap};
use serde_json::Value;

use super::{
    config::{GatewayConfig, ProviderKind},
    forward::Call,
    reach,
    scrub::Scrubber,
    shape::{Api, ApiError, Kind},
    strict,
};
use troupe_domain::model::{Charge, Cost, SessionRow, TokenUsage};

/// Most completions one OpenAI call may ask for (`n`), as OpenAI bounds it.
const MAX_COMPLETIONS: u64 = 128;

/// Most candidates one Gemini call may ask for (`candidateCount`).
const MAX_CANDIDATES: u64 = 8;

/// The routes the gateway serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/messages`.
    Messages,
    /// `POST /v1/messages/count_tokens`.
    CountTokens,
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/responses`.
    Responses,
    /// `POST /v1beta/models/{model}:generateContent`.
    GeminiGenerate,
    /// `POST /v1beta/models/{model}:streamGenerateContent?alt=sse`.
    GeminiStream,
    /// `POST /v1beta/models/{model}:countTokens`.
    GeminiCount,
}

impl Route {
    pub fn api(self) -> Api {
        match self {
            Route::Messages | Route::CountTokens => Api::Anthropic,
            Route::Chat => Api::Openai,
            Route::Responses => Api::Responses,
            Route::GeminiGenerate | Route::GeminiStream | Route::GeminiCount => Api::Gemini,
        }
    }

    /// A Gemini route by its method's name (`generateContent`...).
    pub fn gemini(method: &str) -> Option<Route> {
        match method {
            "generateContent" => Some(Route::GeminiGenerate),
            "streamGenerateContent" => Some(Route::GeminiStream),
            "countTokens" => Some(Route::GeminiCount),
            _ => None,
        }
    }

    /// It counts tokens, generating nothing: a call of no tokens.
    pub fn counts_tokens(self) -> bool {
        matches!(self, Route::CountTokens | Route::GeminiCount)
    }

    /// The path it calls upstream for `model`, under the provider's
    /// `base_url`.
    fn path(self, model: &str) -> String {
        match self {
            Route::Messages => "/v1/messages".to_owned(),
            Route::CountTokens => "/v1/messages/count_tokens".to_owned(),
            Route::Chat => "/v1/chat/completions".to_owned(),
            Route::Responses => "/v1/responses".to_owned(),
            Route::GeminiGenerate => format!("/v1beta/models/{model}:generateContent"),
            Route::GeminiStream => format!("/v1beta/models/{model}:streamGenerateContent?alt=sse"),
            Route::GeminiCount => format!("/v1beta/models/{model}:countTokens"),
        }
    }

    /// Its audit action.
    pub fn action(self) -> troupe_domain::model::Action {
        match self {
            Route::CountTokens | Route::GeminiCount => troupe_domain::model::Action::CountTokens,
            Route::Messages
            | Route::Chat
            | Route::Responses
            | Route::GeminiGenerate
            | Route::GeminiStream => troupe_domain::model::Action::ModelCall,
        }
    }
}

/// The upstream path and query: the route's path (a Gemini stream's with
/// `alt=sse`), and of the agent's query only Anthropic's `beta=true`
/// (which its SDK adds).
fn upstream_path(route: Route, model: &str, query: Option<&str>) -> String {
    let beta = route.api() == Api::Anthropic
        && query.is_some_and(|q| q.split('&').any(|pair| pair == "beta=true"));
    if beta {
        format!("{}?beta=true", route.path(model))
    } else {
        route.path(model)
    }
}

/// The model a request names: a Gemini call's in its path (`model`, given
/// by the router), the others' in their body.
fn model_of(json: &Value, path_model: Option<&str>) -> Result<String, ApiError> {
    if let Some(model) = path_model {
        return Ok(model.to_owned());
    }
    json.get("model")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| ApiError::new(Kind::Invalid, "model: a string is required"))
}

/// A bound the body gives: absent (or null), or a whole number.
fn bound(json: &Value, field: &str) -> Result<Option<u64>, ApiError> {
    match json.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            ApiError::new(
                Kind::Invalid,
                format!("{field}: a whole number is required"),
            )
        }),
    }
}

/// Where a request was sent: its route, the model its path names (a Gemini
/// call's), its query.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub route: Route,
    pub model: Option<&'a str>,
    pub query: Option<&'a str>,
}

/// Checks the request and decides where it goes and what it may cost.
pub fn prepare(
    config: Option<&GatewayConfig>,
    target: Target<'_>,
    headers: HeaderMap,
    body: Bytes,
    session: &SessionRow,
) -> Result<Call, ApiError> {
    let Target {
        route,
        model: path_model,
        query,
    } = target;
    let api = route.api();
    let mut json = strict::parse(&body)
        .map_err(|e| ApiError::new(Kind::Invalid, format!("the body is not JSON: {e}")))?;
    let model = model_of(&json, path_model)?;
    if route == Route::GeminiStream
        && !query.is_some_and(|q| q.split('&').any(|pair| pair == "alt=sse"))
    {
        return Err(ApiError::new(
            Kind::Invalid,
            "streamGenerateContent is served as server-sent events only: add ?alt=sse",
        ));
    }
    let Some(config) = config else {
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
        Api::Openai | Api::Responses => ProviderKind::Openai,
        Api::Gemini => ProviderKind::Gemini,
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
    reach::check(api, &json, provider.allow)?;
    let stream =
        route == Route::GeminiStream || json.get("stream").and_then(Value::as_bool) == Some(true);
    // Each completion asked for may run to the output bound.
    let (max_tokens, completions) = match api {
        Api::Anthropic => (bound(&json, "max_tokens")?, 1),
        Api::Openai => {
            let given = [
                bound(&json, "max_completion_tokens")?,
                bound(&json, "max_tokens")?,
            ];
            let n = bound(&json, "n")?.unwrap_or(1);
            if !(1..=MAX_COMPLETIONS).contains(&n) {
                return Err(ApiError::new(
                    Kind::Invalid,
                    format!("n: from 1 to {MAX_COMPLETIONS} completions"),
                ));
            }
            (given.into_iter().flatten().max(), n)
        }
        Api::Responses => (bound(&json, "max_output_tokens")?, 1),
        Api::Gemini => {
            let config = match json.get("generationConfig") {
                None | Some(Value::Null) => &Value::Null,
                Some(config) if config.is_object() => config,
                Some(_) => {
                    return Err(ApiError::new(
                        Kind::Invalid,
                        "generationConfig: an object is required",
                    ));
                }
            };
            let n = bound(config, "candidateCount")?.unwrap_or(1);
            if !(1..=MAX_CANDIDATES).contains(&n) {
                return Err(ApiError::new(
                    Kind::Invalid,
                    format!(
                        "generationConfig.candidateCount: from 1 to {MAX_CANDIDATES} candidates"
                    ),
                ));
            }
            if json.get("model").is_some() {
                return Err(ApiError::new(
                    Kind::Invalid,
                    "model: a Gemini call's model is the one its path names",
                ));
            }
            let max = bound(config, "maxOutputTokens")?;
            if max == Some(0) {
                return Err(ApiError::new(
                    Kind::Invalid,
                    "generationConfig.maxOutputTokens: at least 1",
                ));
            }
            (max, n)
        }
    };
    let max_tokens = match (max_tokens, route) {
        (_, Route::CountTokens | Route::GeminiCount) => 0,
        (Some(n), _) => n,
        (None, Route::Messages) => {
            return Err(ApiError::new(
                Kind::Invalid,
                "max_tokens: a number is required",
            ));
        }
        (None, _) => {
            // The call's worst case needs a bound: the model's.
            let n = entry.max_output_tokens;
            match api {
                Api::Gemini => {
                    if !json["generationConfig"].is_object() {
                        json["generationConfig"] = serde_json::json!({});
                    }
                    json["generationConfig"]["maxOutputTokens"] = Value::from(n);
                }
                Api::Responses => json["max_output_tokens"] = Value::from(n),
                _ => json["max_completion_tokens"] = Value::from(n),
            }
            n
        }
    };
    // A Responses stream reports its usage in its last event; a Chat
    // Completions stream only when asked.
    let body = match api {
        Api::Anthropic => body,
        Api::Openai => {
            if stream {
                json["stream_options"] = serde_json::json!({"include_usage": true});
            }
            Bytes::from(json.to_string())
        }
        Api::Responses => {
            // Nothing is kept at the provider for another call to read,
            // unless the operator lets calls read what it kept.
            if !provider.allow.remote_content {
                json["store"] = Value::Bool(false);
            }
            Bytes::from(json.to_string())
        }
        Api::Gemini => Bytes::from(json.to_string()),
    };
    let too_large = || ApiError::new(Kind::Invalid, "max_tokens: too large");
    let output = max_tokens.checked_mul(completions).ok_or_else(too_large)?;
    let (worst, worst_tokens) = if route.counts_tokens() {
        // Nothing is generated: a call against the calls budget only.
        let charge = Charge {
            cost: Cost::ZERO,
            tokens: 0,
            calls: 1,
        };
        (charge, TokenUsage::default())
    } else {
        let worst = entry
            .price
            .worst_case(body.len() as u64, output)
            .ok_or_else(too_large)?;
        let tokens = TokenUsage {
            input: body.len() as u64,
            output,
            ..TokenUsage::default()
        };
        (worst, tokens)
    };
    Ok(Call {
        route,
        api,
        scrubber: Scrubber::new(provider.key.expose()),
        provider,
        path_and_query: upstream_path(route, &model, query),
        model,
        price: entry.price,
        timeouts: config.timeouts,
        headers,
        body,
        worst,
        worst_tokens,
        session_id: session.session_id.to_string(),
        workspace_id: session.workspace_id.to_string(),
        agent: session.agent_name.clone(),
        life: session.trace,
        _held: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_anthropics_beta_query_goes_upstream() {
        assert_eq!(
            upstream_path(Route::Messages, "m", Some("beta=true")),
            "/v1/messages?beta=true"
        );
        assert_eq!(
            upstream_path(Route::CountTokens, "m", Some("x=1&beta=true")),
            "/v1/messages/count_tokens?beta=true"
        );
        assert_eq!(
            upstream_path(Route::Messages, "m", Some("api-version=9")),
            "/v1/messages"
        );
        assert_eq!(
            upstream_path(Route::Chat, "m", Some("beta=true")),
            "/v1/chat/completions"
        );
        assert_eq!(
            upstream_path(Route::GeminiStream, "g", Some("alt=sse&key=x&beta=true")),
            "/v1beta/models/g:streamGenerateContent?alt=sse"
        );
    }
}
