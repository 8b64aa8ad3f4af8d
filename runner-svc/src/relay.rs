//! The agents' socket when the session service runs elsewhere
//! (`--session-endpoint`): the runner serves a Unix socket of its own, which
//! it mounts into workspace containers where the service's own socket would
//! be, and relays every connection accepted on it, byte for byte, to the
//! first of the service's TCP endpoints that accepts one.
//!
//! The relay holds no authority and adds none: it never parses, adds or
//! changes a byte, so the agent's HTTP/2 connection, its bearer token and
//! its `traceparent` reach the service as the agent sent them, and the
//! service decides on them as on any other call. Agents keep needing no
//! network in their container.
//!
//! Bounds: at most `--relay-max-connections` relays at once (a connection
//! beyond is closed at once, and counted), each with only
//! `copy_bidirectional`'s buffers. At a stop the socket stops accepting at
//! once, and open relays get the drain time, then are closed.

use std::{
    fmt,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::Context;
use tokio::{
    net::{TcpStream, UnixListener, UnixStream},
    sync::{OwnedSemaphorePermit, Semaphore},
    task::JoinSet,
};
use tokio_util::sync::CancellationToken;
use troupe_proto::failover;

use crate::metrics;

/// File name of the relay's socket: the one agents already know
/// (`/run/troupe/session/session.sock`).
pub const SOCKET_NAME: &str = "session.sock";

/// How long connecting to one endpoint may take before the next is tried.
pub const CONNECT_TIMEOUT: Duration = failover::CONNECT_TIMEOUT;

/// One TCP endpoint of the session service, from `http://host:port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    host: String,
    port: u16,
}

impl Upstream {
    /// Parses `http://host:port` (the port defaults to 80). Only plain
    /// `http://` can be relayed: agents speak cleartext HTTP/2 on their
    /// socket, and the relay does not change a byte of it.
    pub fn parse(text: &str) -> Result<Upstream, String> {
        let rest = text.strip_prefix("http://").ok_or_else(|| {
            format!("session endpoint {text:?} must be a TCP endpoint, http://host:port")
        })?;
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        let shape = || format!("session endpoint {text:?} must be http://host:port");
        if authority.contains(['/', '?', '#', '@']) {
            return Err(shape());
        }
        // `[::1]:7400` connects to `::1`.
        let (host, port) = match authority.strip_prefix('[') {
            Some(bracketed) => {
                let (host, after) = bracketed.split_once(']').ok_or_else(shape)?;
                match after {
                    "" => (host, None),
                    _ => (host, Some(after.strip_prefix(':').ok_or_else(shape)?)),
                }
            }
            None => match authority.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            },
        };
        if host.is_empty() || (host.contains(':') && !authority.starts_with('[')) {
            return Err(shape());
        }
        let port = match port {
            Some(port) => port
                .parse::<u16>()
                .map_err(|_| format!("session endpoint {text:?} has no valid port"))?,
            None => 80,
        };
        Ok(Upstream {
            host: host.to_owned(),
            port,
        })
    }

    async fn connect(&self) -> std::io::Result<TcpStream> {
        let stream = tokio::time::timeout(
            CONNECT_TIMEOUT,
            TcpStream::connect((self.host.as_str(), self.port)),
        )
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
        // HTTP/2's small frames must not wait out delayed ACKs.
        stream.set_nodelay(true)?;
        Ok(stream)
    }
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Parses the `--session-endpoint` values: a list as the CLI and the bridge
/// take it ([`failover::parse_list`]), each entry an [`Upstream`].
pub fn parse_endpoints<S: AsRef<str>>(values: &[S]) -> anyhow::Result<Vec<Upstream>> {
    let list =
        failover::parse_list(values).map_err(|e| anyhow::anyhow!("--session-endpoint: {e}"))?;
    list.iter()
        .map(|text| Upstream::parse(text).map_err(|e| anyhow::anyhow!("--session-endpoint: {e}")))
        .collect()
}

/// The relay: its socket, bound, and where it relays to.
pub struct Relay {
    listener: UnixListener,
    path: PathBuf,
    upstreams: Vec<Upstream>,
    max_connections: usize,
}

impl Relay {
    /// Binds the relay's socket at `path` (a stale socket left by a previous
    /// run is replaced; anything else there is an error), connectable by
    /// every uid: agents run under uids of their own, and every call they
    /// relay needs their token anyway.
    pub fn bind(
        path: &Path,
        upstreams: Vec<Upstream>,
        max_connections: usize,
    ) -> anyhow::Result<Relay> {
        anyhow::ensure!(!upstreams.is_empty(), "no session endpoint to relay to");
        anyhow::ensure!(
            max_connections > 0,
            "the relay needs room for one connection"
        );
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
        }
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)
                .with_context(|| format!("cannot remove the stale {}", path.display()))?,
            Ok(_) => anyhow::bail!("{} exists and is not a socket", path.display()),
            Err(_) => {}
        }
        let listener = UnixListener::bind(path)
            .with_context(|| format!("cannot listen on {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
        Ok(Relay {
            listener,
            path: path.to_path_buf(),
            upstreams,
            max_connections,
        })
    }

    /// Relays until `stop`: then stops accepting, gives open relays `drain`
    /// to end, and closes those still open.
    pub async fn run(self, stop: CancellationToken, drain: Duration) {
        let endpoints: Vec<String> = self.upstreams.iter().map(ToString::to_string).collect();
        tracing::info!(
            socket = %self.path.display(),
            endpoints = %endpoints.join(","),
            max_connections = self.max_connections,
            "relaying agents' connections to the session service"
        );
        let state = Arc::new(State {
            upstreams: self.upstreams,
            unreachable: AtomicBool::new(false),
        });
        let permits = Arc::new(Semaphore::new(self.max_connections));
        let mut full = false;
        let mut open = JoinSet::new();
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                Some(_) = open.join_next(), if !open.is_empty() => {}
                accepted = self.listener.accept() => {
                    let stream = match accepted {
                        Ok((stream, _)) => stream,
                        Err(e) => {
                            // Out of descriptors, most likely: let some close.
                            tracing::warn!(error = %e, "relay cannot accept a connection");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    match permits.clone().try_acquire_owned() {
                        Ok(permit) => {
                            if std::mem::take(&mut full) {
                                tracing::info!("relay below its connection limit again");
                            }
                            open.spawn(relay_one(stream, state.clone(), permit));
                        }
                        Err(_) => {
                            drop(stream);
                            metrics::relay_refused(metrics::RelayRefusal::Limit);
                            if !std::mem::replace(&mut full, true) {
                                tracing::warn!(
                                    max_connections = self.max_connections,
                                    "relay at its connection limit; closing new connections"
                                );
                            }
                        }
                    }
                }
            }
        }
        drop(self.listener);
        let ended =
            tokio::time::timeout(drain, async { while open.join_next().await.is_some() {} }).await;
        if ended.is_err() {
            tracing::info!(
                open = open.len(),
                "closing relayed connections still open after the drain time"
            );
        }
        open.shutdown().await;
    }
}

/// What every relay shares: the endpoints, and whether the last attempt
/// found none (so an outage is logged once, not per connection).
struct State {
    upstreams: Vec<Upstream>,
    unreachable: AtomicBool,
}

impl State {
    /// The first endpoint that accepts a connection, trying each in order.
    async fn connect(&self) -> Option<TcpStream> {
        let mut failures = Vec::new();
        for upstream in &self.upstreams {
            match upstream.connect().await {
                Ok(stream) => {
                    if self.unreachable.swap(false, Ordering::Relaxed) {
                        tracing::info!(endpoint = %upstream, "relaying to the session service again");
                    }
                    return Some(stream);
                }
                Err(e) => failures.push(format!("{upstream}: {e}")),
            }
        }
        metrics::relay_refused(metrics::RelayRefusal::Unreachable);
        if !self.unreachable.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                failures = %failures.join("; "),
                "no session endpoint accepts connections; agents' connections are closed until one does"
            );
        }
        None
    }
}

/// Relays one agent's connection until either side closes it. A connection
/// no endpoint accepts is closed.
async fn relay_one(mut agent: UnixStream, state: Arc<State>, _permit: OwnedSemaphorePermit) {
    let Some(mut upstream) = state.connect().await else {
        return;
    };
    let _open = metrics::relay_opened();
    if let Err(e) = tokio::io::copy_bidirectional(&mut agent, &mut upstream).await {
        tracing::debug!(error = %e, "relayed connection ended");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_http_host_and_port() {
        let parsed =
            parse_endpoints(&["http://10.0.0.2:7400, http://db-a:7400/", "http://[::1]:9"])
                .unwrap();
        let shown: Vec<String> = parsed.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["10.0.0.2:7400", "db-a:7400", "[::1]:9"]);
        assert_eq!(parse_endpoints(&["http://host"]).unwrap()[0].port, 80);
    }

    #[test]
    fn what_cannot_be_relayed_is_refused() {
        for bad in [
            "unix:///run/session.sock",
            "https://host:7400",
            "host:7400",
            "http://",
            "http://host:7400/path",
            "http://user@host:7400",
            "http://host:notaport",
            "http://host:70000",
            "http://:7400",
            "http://a:1:2",
            "http://[::1:7400",
            "http://a:1,,http://b:2",
        ] {
            let err = parse_endpoints(&[bad]).unwrap_err().to_string();
            assert!(err.starts_with("--session-endpoint: "), "{bad}: {err}");
        }
    }
}
