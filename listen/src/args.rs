//! The flags every server takes for its listeners (each with a
//! `TROUPE_*` variable), and the [`Bounds`] they make.

use std::time::Duration;

use crate::gate::Bounds;

/// Connection bounds of a server's listeners.
#[derive(Clone, Debug, clap::Args)]
pub struct ListenArgs {
    /// Most connections each listener holds open at once; one beyond is
    /// closed unread, and counted. Lowered, with a warning, to the
    /// listener's share of the open file limit (raised to its hard limit
    /// at start; 256 descriptors are kept for the database and files).
    #[arg(long, env = "TROUPE_MAX_CONNECTIONS", default_value_t = 4096,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Most connections one TCP client address holds open at once on a
    /// listener (a runner's relay is one address for all its agents).
    #[arg(long, env = "TROUPE_MAX_CONNECTIONS_PER_PEER", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_peer: u32,
    /// Most connections one agent (one uid) holds open at once on the
    /// agents' Unix socket.
    #[arg(long, env = "TROUPE_MAX_CONNECTIONS_PER_AGENT", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_agent: u32,
    /// A connection on which no byte moved either way for this long is
    /// closed (HTTP/2 connections are pinged every minute, so an idle
    /// watcher that answers stays). Longer than the gateway's own upstream
    /// timeouts (300 s by default), which answer first.
    #[arg(long, env = "TROUPE_CONNECTION_IDLE_SECS", default_value_t = 360,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub connection_idle_secs: u64,
    /// Longest time to receive an HTTP/1 request's head on the console,
    /// the metrics endpoint and the MCP bridge's HTTP endpoint (the gRPC
    /// port's HTTP/1 requests, the gateway's, get 30 s).
    #[arg(long, env = "TROUPE_HEADER_TIMEOUT_SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout_secs: u64,
}

impl Default for ListenArgs {
    fn default() -> Self {
        ListenArgs {
            max_connections: 4096,
            max_connections_per_peer: 1024,
            max_connections_per_agent: 64,
            connection_idle_secs: 360,
            header_timeout_secs: 10,
        }
    }
}

impl ListenArgs {
    /// A TCP listener's bounds (peers by address).
    pub fn tcp(&self) -> Bounds {
        Bounds {
            max_connections: self.max_connections as usize,
            max_per_peer: self.max_connections_per_peer as usize,
            idle: Duration::from_secs(self.connection_idle_secs),
            header: Duration::from_secs(self.header_timeout_secs),
        }
    }

    /// The agents' Unix socket's bounds (peers by uid).
    pub fn agents(&self) -> Bounds {
        Bounds {
            max_per_peer: self.max_connections_per_agent as usize,
            ..self.tcp()
        }
    }
}
