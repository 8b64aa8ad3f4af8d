//! Runners as the ledger knows them: their names, what one registers, and
//! the row the store keeps of each (its lease, its load).

use std::fmt;

use crate::error::SessionError;

/// The name of the embedded runner of `--runner`, which needs no
/// registration (and which no registration may take).
pub const STATIC_RUNNER: &str = "default";

/// A runner's name: a slug (as workspace ids are).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunnerName(String);

impl RunnerName {
    /// Parses a name a caller gave: INVALID_ARGUMENT unless it is a slug.
    pub fn parse(name: &str) -> Result<RunnerName, SessionError> {
        if troupe_proto::names::is_slug(name) {
            Ok(RunnerName(name.to_owned()))
        } else {
            Err(SessionError::invalid(
                "name",
                format!(
                    "runner name {name:?} must be 1 to {} letters, digits, '-' or '_', starting with a letter or digit",
                    troupe_proto::names::MAX_SLUG_LEN
                ),
            ))
        }
    }

    /// The embedded runner's name.
    pub fn embedded() -> RunnerName {
        RunnerName(STATIC_RUNNER.to_owned())
    }

    /// A name as stored (written only after [`RunnerName::parse`]).
    pub fn stored(name: String) -> RunnerName {
        RunnerName(name)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RunnerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a runner registers (or what `--runner` stands for).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunnerSpec {
    pub name: RunnerName,
    /// Where the session service reaches it (`http://...` or `unix://...`).
    pub endpoint: String,
    /// How many agents it runs at once.
    pub capacity: u32,
}

/// A runner as the store has it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunnerRow {
    pub name: RunnerName,
    pub endpoint: String,
    pub capacity: u32,
    /// The embedded runner (no lease).
    pub is_static: bool,
    /// Whether its lease is unexpired (always, for the embedded runner),
    /// on the database's clock.
    pub live: bool,
    /// Bumped by each registration after a lapse (or under a new endpoint).
    pub generation: i64,
    /// Its active sessions (pending or running, with a process on it).
    pub active: u32,
}

impl RunnerRow {
    /// Capacity minus active sessions (negative when over).
    pub fn room(&self) -> i64 {
        i64::from(self.capacity) - i64::from(self.active)
    }
}
