//! Which names the console answers to. A page of another site can make a
//! browser send requests to the console by a name of its own (DNS
//! rebinding: `attacker.example` resolved to 127.0.0.1) or post to it
//! across origins; so every request must name an allowed host in its
//! `Host` (the loopback names, and those `--console-allowed-host` adds),
//! and every request that carries an `Origin` (a browser sends one with
//! every POST, and with any request across origins) must come from the
//! console's own origin: the host and port its `Host` names. Anything else
//! is refused 403 before any route runs, with a body that says nothing of
//! the request: a change (the sign-in too) and a read (an event stream a
//! page of another port of the same host would open with the cookie).

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    http::{HeaderMap, Uri, header, uri},
    middleware::Next,
    response::{IntoResponse, Response},
};

use super::calls::ApiError;

/// The names always allowed, with any port.
const LOOPBACK: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// A host and perhaps a port, as a `Host` header or an allowed name gives
/// them: the host in lowercase, an IPv6 address without its brackets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authority {
    host: String,
    port: Option<u16>,
}

impl Authority {
    /// Parses `host`, `host:port` or `[v6]:port`; `None` for anything else
    /// (user info, a path, an empty host, a port that is not a number).
    pub fn parse(text: &str) -> Option<Authority> {
        if text.contains('@') {
            return None;
        }
        let parsed: uri::Authority = text.parse().ok()?;
        if parsed.as_str() != text {
            return None;
        }
        // A port must be digits when a colon is there ("host:" is not one).
        let port = match parsed.port() {
            Some(port) => Some(port.as_u16()),
            None if text.ends_with(':') => return None,
            None => None,
        };
        let host = parsed.host();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.is_empty() {
            return None;
        }
        Some(Authority {
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

/// The `Host` names the console answers to: the loopback names with any
/// port, and each `--console-allowed-host` (with any port unless it names
/// one).
#[derive(Clone, Debug)]
pub struct AllowedHosts(Vec<Authority>);

impl AllowedHosts {
    /// The loopback names and `extra`; an `extra` that is not a host (with
    /// perhaps a port) stops the start.
    pub fn new(extra: &[String]) -> anyhow::Result<AllowedHosts> {
        let mut allowed: Vec<Authority> = LOOPBACK
            .iter()
            .filter_map(|name| Authority::parse(name))
            .collect();
        for name in extra {
            let authority = Authority::parse(name.trim()).ok_or_else(|| {
                anyhow::anyhow!(
                    "--console-allowed-host must be a host name or address, with perhaps a port: {name:?}"
                )
            })?;
            allowed.push(authority);
        }
        Ok(AllowedHosts(allowed))
    }

    /// Whether a request naming `host` is served.
    pub fn allows(&self, host: &Authority) -> bool {
        self.0
            .iter()
            .any(|a| a.host == host.host && (a.port.is_none() || a.port == host.port))
    }
}

/// The authority a request names: its one `Host` header, or (HTTP/2) its
/// URI's. `None` if it names none, several, or not a host.
fn requested(uri: &Uri, headers: &HeaderMap) -> Option<Authority> {
    let mut hosts = headers.get_all(header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        (Some(host), None) => Authority::parse(host.to_str().ok()?),
        (None, _) => Authority::parse(uri.authority()?.as_str()),
        (Some(_), Some(_)) => None,
    }
}

/// Whether `origin` (an `Origin` header's value) is the origin of the
/// console as `host` names it: `http` or `https`, the same host, the same
/// port (a missing one being the scheme's). `null`, another scheme or
/// anything with a path is not.
fn same_origin(origin: &str, host: &Authority) -> bool {
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return false,
    };
    let Some(from) = Authority::parse(rest) else {
        return false;
    };
    from.host == host.host && from.port.unwrap_or(default_port) == host.port.unwrap_or(default_port)
}

/// What a request with a disallowed `Host` or `Origin` is answered: the
/// same for every refusal, naming nothing of the request.
fn refused() -> Response {
    ApiError::forbidden("this host name or origin is not served (see --console-allowed-host)")
        .into_response()
}

/// Middleware: serves a request only if its `Host` is allowed and its
/// `Origin` (if any) is the console's own.
pub async fn guard(
    State(allowed): State<Arc<AllowedHosts>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(host) = requested(request.uri(), request.headers()).filter(|h| allowed.allows(h))
    else {
        tracing::debug!("console request refused: host not allowed");
        return refused();
    };
    let mut origins = request.headers().get_all(header::ORIGIN).iter();
    let origin_ok = match (origins.next(), origins.next()) {
        (None, _) => true,
        (Some(origin), None) => origin.to_str().is_ok_and(|o| same_origin(o, &host)),
        (Some(_), Some(_)) => false,
    };
    if !origin_ok {
        tracing::debug!("console request refused: origin not the console's");
        return refused();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(text: &str) -> Authority {
        Authority::parse(text).unwrap_or_else(|| panic!("{text} parses"))
    }

    #[test]
    fn loopback_names_with_any_port_and_the_added_names_are_allowed() {
        let allowed = AllowedHosts::new(&["console.example".into(), "other.example:8443".into()])
            .expect("valid names");
        for ok in [
            "localhost",
            "localhost:7480",
            "LOCALHOST:1",
            "127.0.0.1:7480",
            "[::1]:7480",
            "[::1]",
            "console.example",
            "console.example:443",
            "other.example:8443",
        ] {
            assert!(allowed.allows(&host(ok)), "{ok} allowed");
        }
        for refused in [
            "attacker.example",
            "attacker.example:7480",
            "localhost.attacker.example",
            "127.0.0.1.nip.io:7480",
            "127.0.0.2:7480",
            "[::2]:7480",
            "other.example",
            "other.example:443",
        ] {
            assert!(!allowed.allows(&host(refused)), "{refused} refused");
        }
        for unparsable in [
            "",
            "user@localhost",
            "localhost/x",
            "localhost:",
            "local host",
        ] {
            assert!(Authority::parse(unparsable).is_none(), "{unparsable:?}");
        }
        assert!(AllowedHosts::new(&["http://console.example".into()]).is_err());
    }

    #[test]
    fn an_origin_is_the_consoles_own_only_with_the_same_host_and_port() {
        let local = host("localhost:7480");
        assert!(same_origin("http://localhost:7480", &local));
        assert!(same_origin("https://LOCALHOST:7480", &local));
        for other in [
            "http://localhost:7481",
            "http://localhost",
            "http://attacker.example:7480",
            "null",
            "file://",
            "ftp://localhost:7480",
            "http://localhost:7480/path",
        ] {
            assert!(!same_origin(other, &local), "{other}");
        }
        let proxied = host("console.example");
        assert!(same_origin("https://console.example", &proxied));
        assert!(same_origin("http://console.example", &proxied));
        assert!(!same_origin("https://console.example:8443", &proxied));
    }
}
