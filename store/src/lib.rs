//! Troupe's store (crate `troupe-store`), the only crate that speaks to a
//! database: the interface, every read and write of the ledger, and its
//! SQLite and PostgreSQL backends with their migrations. Each write that
//! depends on a check runs the check (a [`crate::policy`] function passed in
//! as a closure) inside the same transaction as the write, so concurrent
//! calls cannot both pass a check that only one of them may pass.
//!
//! [`ConsoleStore`] (the web console's reads and sign-ins) is a part of
//! every store.
//!
//! [`SqliteStore`] is the embedded default; [`PgStore`] keeps the ledger in
//! PostgreSQL for several replicas on one database. The rules never see
//! SQL, so each backend implements this trait without touching them
//! (`shared` holds what both decide alike without I/O). What the trait asks
//! of a backend, beyond its methods:
//!
//! - its errors are [`crate::error::SessionError::Storage`] of a backend-neutral kind
//!   (`troupe_domain::error`, its `sqlx` feature: the conversion every sqlx backend's `?` uses), so an
//!   unreachable database answers UNAVAILABLE and nothing else leaks;
//! - the values it stores as text (statuses, event kinds, exit reasons,
//!   principals) are parsed once as it reads them ([`parse_stored`]);
//! - what a process change does to a session is
//!   [`crate::policy::process_step`]'s to decide, the backend's to apply;
//! - what a session's end does to its children (their parent-end policies)
//!   is [`crate::policy::parent_end`]'s to decide, and every write that
//!   ends a session (termination, finish, exit, failure) applies it in its
//!   own transaction (`parent_end`: what both backends write alike);
//! - how it keeps its reads fast (SQLite: the in-memory ledger of sessions,
//!   its own) and what upkeep it needs ([`UpkeepStore::maintain`]) are its own.

mod accounts;
mod agent_rows;
mod backends;
mod budgets;
mod catalog;
mod changes;
mod console;
mod console_rows;
mod creates;
mod ends;
mod groups;
mod inbox;
mod journal;
mod lease;
mod messages;
mod output;
mod parent_end;
mod postgres;
mod process;
mod reads;
mod runners;
mod session_rows;
mod shared;
mod sqlite;
mod upkeep;
mod work;
mod writes;

/// The domain the store keeps, under the names the service gives it.
pub(crate) use troupe_domain::{agent, cursor, error, model, placement, policy, shard};

use troupe_proto::scope::WriteScope;

pub use accounts::{RESERVATION_RELEASE_BATCH, RESERVATION_STALE_AFTER};
pub use budgets::BudgetStore;
pub use catalog::CatalogStore;
pub use changes::ChangeWatch;
pub use console::ConsoleStore;
pub(crate) use console_rows::{ActivityColumns, AuditColumns, MessageColumns, audit_row};
pub use creates::SpawnStore;
pub use ends::EndStore;
pub use groups::GroupStore;
pub use inbox::InboxStore;
pub use journal::LogStore;
pub use lease::{
    Fence, Holder, Lease, LeaseStore, LeaseTiming, REQUEST_ID_PRUNE_BATCH, Replica, share_of,
};
pub use messages::MessageStore;
pub use output::{OUTPUT_EVENT_BYTES, OutputBudget};
pub use postgres::{
    LISTENER_NAME as PG_LISTENER_NAME, POLL_EVERY as PG_POLL_EVERY, PgStore, is_postgres_url,
    redacted_url,
};
pub use process::{DriverWork, ProcessStore};
pub use reads::ReadStore;
pub use runners::RunnerStore;
pub use sqlite::{SqliteStore, WAL_LIMIT};
pub use upkeep::UpkeepStore;
pub use writes::{
    Bounds, ChargeCheck, Created, EventPage, FanOut, FanOutCheck, InboxCheck, Maintenance,
    MembersCheck, MessageCheck, RateCheck, RootCheck, Sent, SpawnCheck, TerminateCheck, Throttle,
};

/// A write scope as the `writable_paths` column keeps it: a JSON array.
pub(crate) fn scope_text(scope: &WriteScope) -> String {
    serde_json::to_string(&scope.to_strings()).unwrap_or_else(|_| "[]".to_owned())
}

/// Reads the `writable_paths` column back.
pub(crate) fn parse_scope(text: &str) -> Option<WriteScope> {
    let paths: Vec<String> = serde_json::from_str(text).ok()?;
    WriteScope::parse(&paths).ok()
}

pub(crate) use crate::error::parse_stored;

/// The ledger's storage: every family of its reads and writes, each
/// declared and implemented in its own module.
pub trait Store:
    BudgetStore
    + CatalogStore
    + ConsoleStore
    + EndStore
    + GroupStore
    + InboxStore
    + LeaseStore
    + LogStore
    + MessageStore
    + ProcessStore
    + ReadStore
    + RunnerStore
    + SpawnStore
    + UpkeepStore
    + Clone
    + 'static
{
}

impl<S> Store for S where
    S: BudgetStore
        + CatalogStore
        + ConsoleStore
        + EndStore
        + GroupStore
        + InboxStore
        + LeaseStore
        + LogStore
        + MessageStore
        + ProcessStore
        + ReadStore
        + RunnerStore
        + SpawnStore
        + UpkeepStore
        + Clone
        + 'static
{
}

/// Every trait of the store, for a caller that holds a concrete one.
pub mod prelude {
    pub use crate::{
        BudgetStore, CatalogStore, ConsoleStore, EndStore, GroupStore, InboxStore, LeaseStore,
        LogStore, MessageStore, ProcessStore, ReadStore, RunnerStore, SpawnStore, Store,
        UpkeepStore,
    };
}
