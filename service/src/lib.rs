//! Troupe's session service proper: every call's handler, the driver of
//! sessions' processes, and the owner of the background work. The binary
//! (`troupe-session-svc`) composes it with the gateway and the console and
//! serves it.
//!
//! - [`auth`]: session tokens and the operator token.
//! - [`operator`]: the operator token, kept in the database for every replica.
//! - [`agents`]: where agent definitions are looked up.
//! - [`rules`]: the limits a call is checked against, as the store applies them.
//! - [`service`]: the gRPC handlers, one module per RPC (the session
//!   service's, and the fleet service's `RegisterRunner`), behind one RPC
//!   wrapper (`Service::call`).
//! - [`driver`]: starts, follows and stops sessions' processes on the runners.
//! - [`lives`]: each session's life exported as a span of its tree's trace.
//! - [`owner`]: the shards' leases of the background work, balanced among
//!   replicas, and the work their holder runs.
//! - [`metrics`]: the service's metrics (spawns, sessions, messages, output).
//!
//! Every decision is `troupe_domain::policy`'s; every read and write is
//! `troupe_store`'s.

pub mod agents;
pub mod auth;
pub mod driver;
pub mod lives;
pub mod metrics;
pub mod operator;
pub mod owner;
pub mod rules;
pub mod service;

use troupe_domain::{cursor, error, model, placement, policy, shard};
use troupe_store as store;
