//! The console's flags (`--console-*`), flattened into the service's, and
//! [`TraceUrl`] (`--console-trace-url`: an `http://` or `https://` URL that
//! names `{trace_id}`).

use std::{net::SocketAddr, time::Duration};

use clap::Args;

/// The web console: where it is served and how its sign-ins behave.
#[derive(Clone, Debug, Args)]
pub struct ConsoleArgs {
    /// Address to serve the web console on, over HTTP (off unless set). Put
    /// it behind a TLS-terminating proxy for anything but loopback, with
    /// `--console-secure-cookie` (docs/operating.md, "Console").
    #[arg(long, env = "TROUPE_CONSOLE_LISTEN")]
    pub console_listen: Option<SocketAddr>,
    /// A `Host` name to serve the console by besides the loopback names
    /// (`localhost`, `127.0.0.1`, `[::1]`, with any port); repeatable, or
    /// comma-separated in the variable. With a port, only that port. Any
    /// other `Host` is refused (403): a page cannot reach the console by a
    /// name of its own (DNS rebinding). Behind a proxy, the name browsers use.
    #[arg(
        long = "console-allowed-host",
        env = "TROUPE_CONSOLE_ALLOWED_HOST",
        value_name = "HOST[:PORT]",
        value_delimiter = ','
    )]
    pub console_allowed_hosts: Vec<String>,
    /// Link from a session to its trace: a URL in which `{trace_id}` is
    /// replaced, e.g. `http://jaeger:16686/trace/{trace_id}` (no link unless set).
    #[arg(long, env = "TROUPE_CONSOLE_TRACE_URL")]
    pub console_trace_url: Option<String>,
    /// Marks the console's cookie `Secure`, so browsers send it over HTTPS
    /// only: set it when the console is served through TLS.
    #[arg(long, env = "TROUPE_CONSOLE_SECURE_COOKIE")]
    pub console_secure_cookie: bool,
    /// How long a console sign-in lasts, in seconds; then the operator
    /// signs in again.
    #[arg(long, env = "TROUPE_CONSOLE_SESSION_TTL_SECS", default_value_t = 12 * 3600,
          value_parser = clap::value_parser!(u64).range(60..))]
    pub console_session_ttl_secs: u64,
    /// Failed sign-ins a client address may make per minute (that many at
    /// once, then one per share of the minute); past it, sign-ins from it
    /// are refused (429, with `Retry-After`) without a look at the token.
    /// IPv6 clients count by their /64.
    #[arg(long, env = "TROUPE_CONSOLE_SIGN_IN_FAILURES_PER_MINUTE", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub console_sign_in_failures_per_minute: u32,
    /// Failed sign-ins all clients together may make per minute (a flood
    /// from many addresses) and have audited one by one; past it, a wrong
    /// token is refused (429) unaudited, counted in the log, while the right
    /// one still signs in. The CLI and agents are not affected.
    #[arg(long, env = "TROUPE_CONSOLE_SIGN_IN_GLOBAL_FAILURES_PER_MINUTE", default_value_t = 60,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub console_sign_in_global_failures_per_minute: u32,
}

impl ConsoleArgs {
    /// How long a sign-in lasts.
    pub fn session_ttl(&self) -> Duration {
        Duration::from_secs(self.console_session_ttl_secs)
    }

    /// Checks the trace URL template: it must name `{trace_id}` and be an
    /// `http://` or `https://` URL (no `javascript:` link).
    pub fn trace_url(&self) -> anyhow::Result<Option<TraceUrl>> {
        let Some(template) = &self.console_trace_url else {
            return Ok(None);
        };
        anyhow::ensure!(
            template.starts_with("http://") || template.starts_with("https://"),
            "--console-trace-url must be an http:// or https:// URL, not {template:?}"
        );
        anyhow::ensure!(
            template.contains("{trace_id}"),
            "--console-trace-url must contain {{trace_id}}: {template:?}"
        );
        Ok(Some(TraceUrl(template.clone())))
    }
}

/// The operator's trace URL template (checked by [`ConsoleArgs::trace_url`]).
#[derive(Clone, Debug)]
pub struct TraceUrl(String);

impl TraceUrl {
    /// The link to trace `trace_id` (hex; anything else gives no link).
    pub fn link(&self, trace_id: &str) -> Option<String> {
        let hex = !trace_id.is_empty() && trace_id.bytes().all(|b| b.is_ascii_hexdigit());
        hex.then(|| self.0.replace("{trace_id}", trace_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(url: &str) -> ConsoleArgs {
        ConsoleArgs {
            console_listen: None,
            console_allowed_hosts: Vec::new(),
            console_trace_url: Some(url.to_owned()),
            console_secure_cookie: false,
            console_session_ttl_secs: 3600,
            console_sign_in_failures_per_minute: 5,
            console_sign_in_global_failures_per_minute: 60,
        }
    }

    #[test]
    fn trace_url_templates_are_http_links_with_the_trace_id() {
        let url = args("http://jaeger:16686/trace/{trace_id}")
            .trace_url()
            .unwrap()
            .unwrap();
        assert_eq!(
            url.link("4bf92f3577b34da6a3ce929d0e0e4736").as_deref(),
            Some("http://jaeger:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(url.link(""), None);
        assert_eq!(url.link("<script>"), None);
        assert!(args("javascript:alert(1)/{trace_id}").trace_url().is_err());
        assert!(args("http://jaeger/trace").trace_url().is_err());
    }
}
