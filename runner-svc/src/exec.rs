//! Execs: starting them, following their logs, watching, writing stdin,
//! terminating, and finding them again after a restart.
//!
//! Every exec has:
//! - a record of the runner's own, `<state>/execs/<exec_id>.json`, which the
//!   agent cannot reach (uid, container, Docker exec id), and beside it
//!   `<exec_id>.stdin`, the last stdin frame sequence the exec received;
//! - a directory the agent's uid owns, `<state>/workspaces/<ws>/execs/<exec_id>`,
//!   mounted into the container (see [`crate::layout`]).
//!
//! Since the agent owns that directory, every file in it is opened without
//! following symlinks and checked (type, owner) before the runner, as root,
//! reads or writes it. The runner keeps those descriptors open for the
//! exec's life.
//!
//! One follower task per exec parses the log's record headers as the
//! supervisor appends them (woken by inotify), keeps a sparse index of
//! record offsets, and publishes the exec's [`Progress`]. Watchers read the
//! records themselves, by offset, so each goes at its own pace.
//!
//! This module holds the types callers see; the work is in its parts:
//! - `registry`: [`Runner`], the execs of this runner (open, get, list,
//!   retention of exited execs);
//! - `handle`: [`Exec`], one exec (progress, reading records, acks);
//! - `start`: starting an exec;
//! - `control`: writing an exec's stdin (each sequenced frame once),
//!   terminating it;
//! - `follower`: the task that follows an exec's log to its end, its
//!   liveness and its deadline;
//! - `scanner`: parsing record headers from the log's bytes;
//! - `recovery`: finding the execs of a previous run;
//! - `files`: the runner's files on disk (exec records, the uid counter,
//!   the workspace and exec directories);
//! - `bounds`: what the logs keep; `outage`: judging execs while the engine
//!   does not answer.

use std::{collections::HashMap, path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

use crate::log::Exit;
pub use crate::request::StartSpec;

mod bounds;
mod control;
mod files;
mod follower;
mod handle;
mod outage;
mod recovery;
mod registry;
mod scanner;
mod start;

pub use bounds::{LogLimits, Next, Place};
pub use handle::Exec;
pub use registry::Runner;

/// How often a running exec's process is checked with the engine.
const LIVENESS_EVERY: Duration = Duration::from_secs(1);

/// What the runner needs to run execs.
#[derive(Clone, Debug)]
pub struct Settings {
    pub state_dir: PathBuf,
    pub workspaces_dir: PathBuf,
    pub uid_base: u32,
    /// The container's process limit (0 or less: none), `--pids-limit`.
    pub pids_limit: i64,
    pub exec_pids_limit: u64,
    pub output_window: u64,
    /// What the logs keep.
    pub logs: LogLimits,
    pub timeout_grace_ms: u64,
    /// How long an exited exec stays listed and watchable.
    pub keep_exited: Duration,
    /// `TROUPE_SESSION_ENDPOINT` when the caller gives none.
    pub default_endpoint: Option<String>,
}

/// The runner's record of an exec; never in a directory the agent can write.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Meta {
    pub exec_id: String,
    pub workspace_id: String,
    pub container_id: String,
    pub docker_exec_id: String,
    pub uid: u32,
    pub started_at_micros: u64,
    pub labels: HashMap<String, String>,
    /// The exec's timeout (0: none), which the runner enforces as well.
    #[serde(default)]
    pub timeout_ms: u64,
    /// Its supervisor's host process, once the engine has named it: a
    /// runner started again while the engine does not answer still tells
    /// whether it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supervisor: Option<outage::HostProcess>,
}

/// A piece of stdin its sender numbered: written at most once per exec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub sequence: u64,
    pub data: Vec<u8>,
}

/// What a write gives an exec's stdin.
#[derive(Clone, Debug)]
pub enum StdinInput {
    /// Unsequenced bytes, written as they come (execs fed by hand).
    Bytes(Vec<u8>),
    /// Sequenced frames, increasing: only those above the exec's last
    /// received sequence are written.
    Frames(Vec<Frame>),
}

impl Default for StdinInput {
    fn default() -> Self {
        StdinInput::Bytes(Vec::new())
    }
}

impl StdinInput {
    pub fn is_empty(&self) -> bool {
        match self {
            StdinInput::Bytes(data) => data.is_empty(),
            StdinInput::Frames(frames) => frames.is_empty(),
        }
    }
}

/// How far an exec's log goes.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    /// Sequence of the last complete record.
    pub last_sequence: u64,
    /// Offset just after it.
    pub end: u64,
    /// Authoritative: where the runner ended the exec, its reason, not the log's.
    pub exit: Option<Exit>,
}

/// Why a call was refused.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("{0}")]
    Invalid(String),
    #[error("exec {0:?} already exists")]
    AlreadyExists(String),
    #[error("no exec {0:?}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    OutOfRange(String),
    /// The engine does not answer: the caller may try again later.
    #[error("{0}")]
    Unavailable(String),
    /// The workspace's container has no room for another exec.
    #[error("{0}")]
    NoResources(String),
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}
