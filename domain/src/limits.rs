//! The limits the rules apply: spawn [`Limits`] and [`MessageLimits`] (the
//! message rate, the fan-out cap, an inbox's unread bytes). Each is a set of
//! `troupe-session` flags (each with a `TROUPE_*` variable) and a stored
//! setting.

use clap::Args;

/// Longest accepted title, reason or request id, in bytes.
pub const MAX_SHORT_TEXT: usize = 256;
/// Longest accepted message or initial message, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// Limits of messages: every message a session stores in another's inbox
/// (`SendMessage`, `ReplyToParent`, and each recipient of a `Broadcast` or a
/// `PostToGroup`) counts against its rates, in messages and in bytes; one
/// broadcast or post reaches at most `max_fan_out` sessions; an inbox holds
/// at most `max_unread_bytes` not yet delivered.
#[derive(Clone, Copy, Debug, PartialEq, Args, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct MessageLimits {
    /// Sustained messages per second one session may send; each recipient of
    /// a broadcast or a group post counts as one. 0 disables the limit.
    #[arg(long, env = "TROUPE_MESSAGE_RATE", default_value_t = 10.0)]
    pub message_rate_per_sec: f64,
    /// Messages one session may send in a burst above the sustained rate: a
    /// broadcast or a group post to more recipients than this is refused.
    #[arg(long, env = "TROUPE_MESSAGE_BURST", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub message_burst: u32,
    /// Most sessions one broadcast or group post may reach (a group holds at
    /// most this many members besides its poster); more is refused before
    /// anything is stored.
    #[arg(long, env = "TROUPE_MAX_FAN_OUT", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_fan_out: u32,
    /// Sustained bytes per second of messages one session may send; each
    /// recipient of a broadcast or a group post counts the whole body.
    /// 0 disables the limit.
    #[arg(long, env = "TROUPE_MESSAGE_BYTES_RATE", default_value_t = 64 * 1024)]
    pub message_bytes_per_sec: u64,
    /// Bytes of messages one session may send in a burst above the sustained
    /// byte rate: at least one message of the largest size (256 KiB).
    #[arg(long, env = "TROUPE_MESSAGE_BYTES_BURST", default_value_t = 2 * 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(MAX_MESSAGE_BYTES as u64..))]
    pub message_bytes_burst: u64,
    /// Most bytes of messages a session's inbox holds not yet delivered to
    /// it (at least one message of the largest size, 256 KiB): a message
    /// past it is refused (INBOX_FULL), or left out of a broadcast.
    #[arg(long, env = "TROUPE_MAX_UNREAD_BYTES", default_value_t = 8 * 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(MAX_MESSAGE_BYTES as u64..))]
    pub max_unread_bytes: u64,
}

impl Default for MessageLimits {
    fn default() -> Self {
        MessageLimits {
            message_rate_per_sec: 10.0,
            message_burst: 100,
            max_fan_out: 64,
            message_bytes_per_sec: 64 * 1024,
            message_bytes_burst: 2 * 1024 * 1024,
            max_unread_bytes: 8 * 1024 * 1024,
        }
    }
}

/// Spawn limits (Pinocchio's `NestedSpawnConfig`, Parachute's spawn-bomb guards).
#[derive(Clone, Copy, Debug, PartialEq, Args, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Limits {
    /// Deepest allowed session (a root is depth 0).
    #[arg(long, env = "TROUPE_MAX_DEPTH", default_value_t = 2)]
    pub max_depth: u32,
    /// Sessions one spawn tree may ever hold, its root included.
    #[arg(long, env = "TROUPE_MAX_TREE_SESSIONS", default_value_t = 10)]
    pub max_tree_sessions: u32,
    /// Children one session may ever create.
    #[arg(long, env = "TROUPE_MAX_CHILDREN", default_value_t = 10)]
    pub max_children: u32,
    /// Sessions a workspace may have pending or running at once.
    #[arg(long, env = "TROUPE_MAX_ACTIVE_PER_WORKSPACE", default_value_t = 100)]
    pub max_active_per_workspace: u32,
    /// Sustained spawns per second one session may make.
    #[arg(long, env = "TROUPE_SPAWN_RATE", default_value_t = 1.0)]
    pub spawn_rate_per_sec: f64,
    /// Spawns one session may make in a burst above the sustained rate.
    #[arg(long, env = "TROUPE_SPAWN_BURST", default_value_t = 3)]
    pub spawn_burst: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_depth: 2,
            max_tree_sessions: 10,
            max_children: 10,
            max_active_per_workspace: 100,
            spawn_rate_per_sec: 1.0,
            spawn_burst: 3,
        }
    }
}
