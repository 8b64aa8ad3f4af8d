//! Bounded listeners: what every Troupe server puts between its sockets and
//! its protocol, so that no client, however hostile, takes more than its
//! share of the process.
//!
//! - [`gate`]: a listener's caps, on connections in all and per peer (an
//!   IP address, or on a Unix socket the peer's uid), each connection
//!   holding a [`gate::Permit`]; refusals and accept failures counted in
//!   the metrics and logged (at most every few seconds).
//! - [`io`]: a connection that closes when neither side has moved a byte
//!   for its idle time ([`io::Guarded`]).
//! - [`accept`]: TCP and Unix listeners behind a gate, as a stream for
//!   tonic and as an axum [`axum::serve::Listener`]; accept failures
//!   (`EMFILE` above all) back off instead of spinning.
//! - [`http`]: an axum app served with HTTP/1 header read timeouts (axum's
//!   own `serve` sets none).
//! - [`args`]: the flags every server takes for them.
//! - [`descriptors`]: the process's descriptor limit raised to its hard
//!   limit at start, and the listeners' caps fitted under it with a
//!   reserve kept for the database and files.

pub mod accept;
pub mod args;
pub mod descriptors;
pub mod gate;
pub mod http;
pub mod io;

pub use accept::{BoundedTcp, BoundedUnix};
pub use args::ListenArgs;
pub use descriptors::Descriptors;
pub use gate::{Bounds, Gate, Peer};
