//! Reaching troupe-session: which token to send, where the operator token
//! lives, and a client per endpoint that puts `authorization: Bearer <token>`
//! on every call.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use tonic::{service::interceptor::InterceptedService, transport::Channel};
use troupe_proto::{
    endpoint::Bearer,
    failover::{self, Endpoints},
    fleet::fleet_service_client::FleetServiceClient,
    paths::{default_data_dir, operator_token_path},
    session::session_service_client::SessionServiceClient,
};

use crate::cli::Global;

/// The session service client the commands use.
pub type Client = SessionServiceClient<InterceptedService<Channel, Bearer>>;

/// The fleet service client (`troupe runner`), on the same endpoints.
pub type FleetClient = FleetServiceClient<InterceptedService<Channel, Bearer>>;

/// Where the bearer token came from, for hints when the server refuses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenOrigin {
    Flag,
    OperatorEnv,
    OperatorFile(PathBuf),
}

impl std::fmt::Display for TokenOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenOrigin::Flag => f.write_str("--token/TROUPE_TOKEN"),
            TokenOrigin::OperatorEnv => f.write_str("TROUPE_OPERATOR_TOKEN"),
            TokenOrigin::OperatorFile(path) => write!(f, "{}", path.display()),
        }
    }
}

/// Returns the token to send and where it came from: `--token`, else
/// `TROUPE_OPERATOR_TOKEN`, else `<data-dir>/operator.token`.
pub fn resolve_token(global: &Global) -> anyhow::Result<(String, TokenOrigin)> {
    if let Some(token) = nonempty(global.token.as_deref()) {
        return Ok((token, TokenOrigin::Flag));
    }
    let env = std::env::var("TROUPE_OPERATOR_TOKEN").ok();
    if let Some(token) = nonempty(env.as_deref()) {
        return Ok((token, TokenOrigin::OperatorEnv));
    }
    let dir = global.data_dir.clone().unwrap_or_else(default_data_dir);
    let path = operator_token_path(&dir);
    let token = read_operator_token(&path)?;
    Ok((token, TokenOrigin::OperatorFile(path)))
}

fn nonempty(token: Option<&str>) -> Option<String> {
    token
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
}

fn read_operator_token(path: &Path) -> anyhow::Result<String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "no operator token: {} does not exist; start troupe-session once with the same \
             data dir (it writes the token there), pass --data-dir, or set TROUPE_OPERATOR_TOKEN",
            path.display()
        ),
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot read operator token {}", path.display()));
        }
    };
    match nonempty(Some(&text)) {
        Some(token) => Ok(token),
        None => bail!(
            "no operator token: {} is empty; restart troupe-session to regenerate it, \
             or set TROUPE_OPERATOR_TOKEN",
            path.display()
        ),
    }
}

/// Returns the endpoint as a URL, adding `http://` when no scheme is given.
pub fn endpoint_url(endpoint: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("http://{endpoint}")
    }
}

/// Returns the endpoints as URLs (see [`endpoint_url`]); an empty one is an error.
pub fn endpoint_urls(endpoints: &[String]) -> anyhow::Result<Vec<String>> {
    let endpoints =
        failover::parse_list(endpoints).map_err(|e| anyhow::anyhow!("--endpoint: {e}"))?;
    Ok(endpoints.iter().map(|e| endpoint_url(e)).collect())
}

/// A client per endpoint of troupe-session, each connecting on first use:
/// a call moves on from an endpoint it cannot reach ([`failover`]).
pub fn connect(endpoints: &[String], token: &str) -> anyhow::Result<Endpoints<Client>> {
    connect_with(endpoints, token, SessionServiceClient::with_interceptor)
}

/// As [`connect`], for the fleet service served beside the session service.
pub fn connect_fleet(endpoints: &[String], token: &str) -> anyhow::Result<Endpoints<FleetClient>> {
    connect_with(endpoints, token, FleetServiceClient::with_interceptor)
}

fn connect_with<C: Clone>(
    endpoints: &[String],
    token: &str,
    make: impl Fn(Channel, Bearer) -> C,
) -> anyhow::Result<Endpoints<C>> {
    let bearer = Bearer::new(Some(token))?;
    let urls = endpoint_urls(endpoints)?;
    Endpoints::new(&urls, |channel| make(channel, bearer.clone()))
        .map_err(|e| anyhow::anyhow!("invalid endpoint: {e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_without_scheme_gets_http() {
        assert_eq!(endpoint_url("127.0.0.1:7400"), "http://127.0.0.1:7400");
        assert_eq!(endpoint_url("https://h:1"), "https://h:1");
    }

    #[test]
    fn missing_operator_token_file_says_how_to_fix() {
        let path = std::env::temp_dir().join("troupe-cli-no-such-dir/operator.token");
        let err = read_operator_token(&path).unwrap_err().to_string();
        assert!(err.contains("does not exist"), "{err}");
        assert!(err.contains("TROUPE_OPERATOR_TOKEN"), "{err}");
    }
}
