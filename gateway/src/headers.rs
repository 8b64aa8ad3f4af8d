//! The headers that cross the provider boundary, each way, by allowlist:
//! what the agent's request may carry upstream ([`upstream_headers`]) and
//! what of the provider's answer reaches the agent ([`relayed_headers`]).
//! Everything else stays on its side: forwarding and proxy headers,
//! cookies, an organisation or project of the agent's choosing, betas the
//! operator did not allow, the provider's organisation id, its cookies.

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};

use super::{
    config::{Provider, ProviderKind},
    scrub::Scrubber,
    shape::{ApiError, Kind},
};

/// The agent's own headers sent on as they are (the rest are the
/// gateway's to set): content negotiation and, to Anthropic, the API's
/// version.
fn from_agent(kind: ProviderKind) -> &'static [&'static str] {
    match kind {
        ProviderKind::Anthropic => &["accept", "anthropic-version"],
        ProviderKind::Openai | ProviderKind::Gemini => &["accept"],
    }
}

/// The provider's answer headers relayed to the agent: the body's type,
/// ids to quote to support, and what a client needs to back off.
const RELAYED: [&str; 7] = [
    "content-type",
    "cache-control",
    "request-id",
    "x-request-id",
    "retry-after",
    "retry-after-ms",
    "x-should-retry",
];

/// Relayed by prefix: the providers' rate-limit headers.
const RELAYED_PREFIXES: [&str; 2] = ["anthropic-ratelimit-", "x-ratelimit-"];

/// The request headers that go upstream: the allowlisted ones of the
/// agent's, `anthropic-beta` cut to the provider's `allowed_betas`, the
/// operator's OpenAI organisation and project, and the provider's key.
pub fn upstream_headers(agent: &HeaderMap, provider: &Provider) -> Result<HeaderMap, ApiError> {
    let mut out = HeaderMap::new();
    for &name in from_agent(provider.kind) {
        for value in agent.get_all(name) {
            out.append(HeaderName::from_static(name), value.clone());
        }
    }
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if provider.kind == ProviderKind::Anthropic
        && let Some(betas) = allowed_betas(agent, &provider.allowed_betas)
    {
        out.insert(HeaderName::from_static("anthropic-beta"), betas);
    }
    if provider.kind == ProviderKind::Openai {
        for (name, value) in [
            ("openai-organization", &provider.organization),
            ("openai-project", &provider.project),
        ] {
            if let Some(value) = value {
                let value = HeaderValue::from_str(value.as_str())
                    .map_err(|_| ApiError::new(Kind::Internal, "a provider header is not valid"))?;
                out.insert(HeaderName::from_static(name), value);
            }
        }
    }
    let key = provider.key.expose();
    let (name, value) = match provider.kind {
        ProviderKind::Anthropic => ("x-api-key", key.to_owned()),
        ProviderKind::Openai => ("authorization", format!("Bearer {key}")),
        ProviderKind::Gemini => ("x-goog-api-key", key.to_owned()),
    };
    let mut value = HeaderValue::from_str(&value)
        .map_err(|_| ApiError::new(Kind::Internal, "the provider's key is not a header value"))?;
    value.set_sensitive(true);
    out.insert(HeaderName::from_static(name), value);
    Ok(out)
}

/// The agent's `anthropic-beta` values (comma-separated, in one header or
/// several) that `allowed` lists, joined; `None` if none is.
fn allowed_betas(agent: &HeaderMap, allowed: &[String]) -> Option<HeaderValue> {
    let kept: Vec<&str> = agent
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|b| allowed.iter().any(|a| a == b))
        .collect();
    if kept.is_empty() {
        return None;
    }
    HeaderValue::from_str(&kept.join(",")).ok()
}

/// Whether the provider's answer header `name` reaches the agent.
fn relayed(name: &str) -> bool {
    RELAYED.contains(&name) || RELAYED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The provider's answer headers the agent gets: the allowlisted ones
/// whose value holds nothing of the key.
pub fn relayed_headers(provider: &HeaderMap, scrubber: &Scrubber) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in provider {
        if !relayed(name.as_str()) {
            continue;
        }
        if scrubber.reveals(value.as_bytes()) {
            tracing::warn!(header = %name, "a provider's answer header held its key: dropped");
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allowed_betas_are_kept_from_every_header_and_list() {
        let mut agent = HeaderMap::new();
        agent.append(
            "anthropic-beta",
            HeaderValue::from_static("a-1, mcp-client-2025-04-04"),
        );
        agent.append("anthropic-beta", HeaderValue::from_static("b-2,c-3"));
        let allowed = ["a-1".to_owned(), "c-3".to_owned()];
        assert_eq!(allowed_betas(&agent, &allowed).unwrap(), "a-1,c-3");
        assert!(allowed_betas(&agent, &[]).is_none());
    }

    #[test]
    fn only_allowlisted_answer_headers_are_relayed() {
        for name in [
            "content-type",
            "request-id",
            "retry-after",
            "anthropic-ratelimit-tokens-limit",
            "x-ratelimit-remaining-requests",
        ] {
            assert!(relayed(name), "{name}");
        }
        for name in [
            "set-cookie",
            "anthropic-organization-id",
            "openai-organization",
            "x-leak",
            "server",
            "via",
        ] {
            assert!(!relayed(name), "{name}");
        }
    }
}
