//! The files of an exec's directory, shared by the runner (on the host) and
//! the supervisor (inside the container, under `/run/troupe/execs/<exec>`).
//!
//! The directory belongs to the exec's uid (mode 0700), so no other agent of
//! the workspace can read or write it. Its parent is root's, mode 0711: an
//! agent cannot list its siblings' ids nor replace its own directory.

/// The output log (see [`crate::log`]). Created by the runner, appended by the supervisor.
pub const LOG: &str = "output.log";
/// FIFO of stdin frames, runner to supervisor.
pub const STDIN: &str = "stdin";
/// FIFO of control lines (`term <grace_ms>`), runner to supervisor.
pub const CONTROL: &str = "control";
/// 8 bytes, little endian: how far into the log a watcher has read.
/// The supervisor stops reading the agent's output while it is more than
/// its window ahead: that is the backpressure a slow watcher exerts.
pub const ACK: &str = "ack";
/// The agent's `$HOME`.
pub const HOME: &str = "home";
/// The agent's `$TMPDIR`: the root filesystem, `/tmp` included, is read-only.
pub const TMP: &str = "tmp";

/// A stdin frame is a u32 LE length, then that many bytes; this length
/// instead closes the agent's stdin.
pub const STDIN_CLOSE: u32 = u32::MAX;
/// Largest stdin frame payload: with its length, one `PIPE_BUF` (4096
/// bytes), so each frame reaches the FIFO whole. The supervisor closes the
/// agent's stdin on a longer one.
pub const STDIN_FRAME: usize = 4096 - 4;

/// Where the exec directories of a workspace are mounted in its container.
pub const CONTAINER_EXECS: &str = "/run/troupe/execs";
/// Where Troupe's tools (the supervisor, the MCP bridge) are mounted, read-only.
pub const CONTAINER_TOOLS: &str = "/opt/troupe/bin";
/// Where the session service's socket directory is mounted, read-only.
pub const CONTAINER_SESSION_DIR: &str = "/run/troupe/session";
/// Where the workspace's files are mounted.
pub const CONTAINER_WORKSPACE: &str = "/workspace";
/// The supervisor's file name in the tools directory.
pub const SUPERVISOR: &str = "troupe-supervisor";
