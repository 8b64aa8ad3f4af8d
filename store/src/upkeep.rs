//! The store's background upkeep, each backend its own (`sqlite::upkeep`,
//! `postgres::events`): pruning events and request ids under the lease of
//! the background work, and what the backend needs besides.

use std::future::Future;

use crate::{Fence, Maintenance, error::SessionError};

/// The background upkeep; every [`super::Store`] is one.
pub trait UpkeepStore: Send + Sync {
    /// Deletes all but the newest `keep` events; returns the highest id
    /// pruned. Background work: refused unless `fence` is the lease's term.
    fn prune_events(
        &self,
        fence: &Fence,
        keep: u64,
    ) -> impl Future<Output = Result<i64, SessionError>> + Send;

    /// Deletes at most `limit` request-id records of callers' calls made
    /// before `before_ms` (ms since the Unix epoch), in one transaction;
    /// returns how many it deleted. Background work: refused unless `fence`
    /// is the lease's term.
    fn prune_request_ids(
        &self,
        fence: &Fence,
        before_ms: i64,
        limit: u32,
    ) -> impl Future<Output = Result<u64, SessionError>> + Send;

    /// Periodic upkeep the backend needs (SQLite: checkpointing its
    /// write-ahead log, returning free pages to the file system), a bounded
    /// amount per call, off the request path; nothing for a backend that
    /// needs none. Called every second by the service.
    fn maintain(&self) -> impl Future<Output = Result<Maintenance, SessionError>> + Send;
}
