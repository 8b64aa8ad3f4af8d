//! Troupe's domain: the records the session service reasons about
//! ([`model`]), every rule it applies to them ([`policy`]), where a
//! workspace's agents run ([`placement`]), which shard's owner drives them
//! ([`shard`]), where a watcher stands in the event log ([`cursor`]), agent definitions ([`agent`]),
//! the limits the rules read ([`limits`]), and every way a call can fail
//! ([`error`]). No database, no HTTP: the store, the gateway and the console
//! are crates of their own, which this one knows nothing of.

pub mod agent;
pub mod cursor;
pub mod error;
pub mod limits;
pub mod model;
pub mod placement;
pub mod policy;
pub mod shard;
