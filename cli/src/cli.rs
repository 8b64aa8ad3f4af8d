//! The `troupe` command line, as clap derive types. Parsing only: what each
//! command does lives in [`crate::cmd`].

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use troupe_proto::session::{ParentEndPolicy, TrustLevel};

/// `troupe`: operate Troupe's session service (spawn trees of AI agents).
#[derive(Debug, Parser)]
#[command(name = "troupe", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command takes, before or after the subcommand.
#[derive(Debug, Args)]
pub struct Global {
    /// Address of troupe-session (`http://host:port`, `unix:///path`). For
    /// replicas on one database give several, separated by commas (or the
    /// flag repeated): a call that cannot reach one (refused, lost, the
    /// server stopping) goes on to the next, each tried once (a lone one
    /// twice, 200 ms apart); a watch resumes on the next after its last
    /// cursor.
    #[arg(
        long,
        global = true,
        env = "TROUPE_ENDPOINT",
        value_name = "ENDPOINT[,ENDPOINT...]",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7400"
    )]
    pub endpoint: Vec<String>,
    /// Bearer token to use instead of the operator token (e.g. a session's
    /// token, to act as that session). Without it the operator token is taken
    /// from TROUPE_OPERATOR_TOKEN, else from `<data-dir>/operator.token`.
    #[arg(long, global = true, env = "TROUPE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Where troupe-session keeps its data (and the operator token); default:
    /// `$XDG_DATA_HOME/troupe`, else `$HOME/.local/share/troupe`, else `./troupe-data`.
    #[arg(long, global = true, env = "TROUPE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Print JSON (JSON lines for streams) instead of text.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create, inspect, message, watch and end sessions.
    Session {
        #[command(subcommand)]
        command: SessionCommand,
    },
    /// Read the audit log (operator only).
    Audit(AuditArgs),
    /// Manage the agent definitions kept in the database, shared by every
    /// session service on it (operator only).
    Agent {
        #[command(subcommand)]
        command: AgentCommand,
    },
    /// See the runners the session service drives (operator only).
    Runner {
        #[command(subcommand)]
        command: RunnerCommand,
    },
    /// See the session service's replicas and the shards of background
    /// work each holds (operator only).
    Replica {
        #[command(subcommand)]
        command: ReplicaCommand,
    },
    /// Message many sessions at once, and see the groups sessions keep.
    Group {
        #[command(subcommand)]
        command: GroupCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum RunnerCommand {
    /// List the runners: the embedded one (`--runner`) and every registered
    /// one, live or lapsed, with their capacity and active sessions.
    List,
}

#[derive(Debug, Subcommand)]
pub enum ReplicaCommand {
    /// List the replicas, live or not, each with the shards it holds and
    /// their epochs, and the shards no replica holds now.
    List,
}

#[derive(Debug, Subcommand)]
pub enum GroupCommand {
    /// List a workspace's groups, each with its members.
    List(GroupListArgs),
    /// Store one message in the inbox of every active session of a
    /// workspace, and show what each recipient got.
    Broadcast(BroadcastArgs),
}

#[derive(Debug, Args)]
pub struct GroupListArgs {
    /// The workspace whose groups to list.
    #[arg(long, value_name = "W")]
    pub workspace: String,
}

#[derive(Debug, Args)]
pub struct BroadcastArgs {
    /// The workspace whose active sessions receive the message.
    #[arg(long, value_name = "W")]
    pub workspace: String,
    /// The message, shown to each recipient as from the operator.
    #[arg(long)]
    pub message: String,
    /// Makes the call safe to retry: the same id and message give the same
    /// answer, and each message is stored once. Default: a fresh id.
    #[arg(long, value_name = "ID")]
    pub request_id: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Store an agent definition (a Markdown file with YAML front matter, as
    /// in the agents directory) under its file's name, replacing the one of
    /// that name. Sessions created afterwards use it; running ones keep
    /// their command.
    Apply(AgentApplyArgs),
    /// List the agent definitions kept in the database (not the files).
    List(AgentListArgs),
    /// Remove an agent definition from the database.
    Rm(AgentRmArgs),
}

#[derive(Debug, Args)]
pub struct AgentApplyArgs {
    /// The definition, `NAME.md`: NAME is the agent's name.
    #[arg(value_name = "FILE.md")]
    pub file: PathBuf,
    /// The workspace it is for. Default: every workspace (a workspace's own
    /// definition of the same name comes first).
    #[arg(long, value_name = "W")]
    pub workspace: Option<String>,
}

#[derive(Debug, Args)]
pub struct AgentListArgs {
    /// Only the definitions for this workspace. Default: every definition.
    #[arg(long, value_name = "W")]
    pub workspace: Option<String>,
}

#[derive(Debug, Args)]
pub struct AgentRmArgs {
    /// The agent's name.
    pub name: String,
    /// The workspace the definition is for. Default: the one for every workspace.
    #[arg(long, value_name = "W")]
    pub workspace: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Create a root session (a new spawn tree), or with --parent a child of that session.
    Create(CreateArgs),
    /// List the sessions of a workspace.
    List(ListArgs),
    /// Show one session, its direct children, its inbox count and its
    /// agent's latest output.
    Get(GetArgs),
    /// Show the whole spawn tree containing a session, each session with the
    /// cost (USD) and tokens of its own model calls and of its subtree's.
    Tree(TreeArgs),
    /// End a session and its whole subtree.
    Terminate(TerminateArgs),
    /// Mint a token for an active session and print it alone.
    Token(IdArg),
    /// Store a message in a session's inbox.
    Send(SendArgs),
    /// Stream session events, one line each.
    Watch(WatchArgs),
}

#[derive(Debug, Args)]
pub struct IdArg {
    /// Session id (`sess_...`).
    pub id: String,
}

#[derive(Debug, Args)]
pub struct GetArgs {
    /// Session id (`sess_...`).
    pub id: String,
    /// Print only the agent's latest output, exactly as it was written
    /// (control characters and escape sequences included): for a file or a
    /// pipe, not a terminal. Otherwise they are shown escaped (`\u{1b}`).
    #[arg(long, env = "TROUPE_RAW")]
    pub raw: bool,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Workspace of the new tree (with --parent: checked against the parent's, if given).
    #[arg(long, required_unless_present = "parent")]
    pub workspace: Option<String>,
    /// Agent to run: its definition in the database (`troupe agent`), else
    /// the service's `<agents-dir>/<workspace>/<name>.md`, else `<agents-dir>/<name>.md`.
    #[arg(long)]
    pub agent: String,
    #[arg(long, default_value = "")]
    pub title: String,
    /// First message of the session's inbox.
    #[arg(long, default_value = "")]
    pub message: String,
    /// direct, sandboxed (aliases: trusted, untrusted). Default: sandboxed for
    /// a root, the parent's level for a child.
    #[arg(long, value_name = "LEVEL", value_parser = parse_trust)]
    pub trust_level: Option<TrustLevel>,
    /// Create a child of this session, on its behalf.
    #[arg(long, value_name = "SESSION_ID")]
    pub parent: Option<String>,
    /// Makes the call safe to retry: the same id and payload give the same
    /// session. Default: a fresh id, so that the call, if repeated on another
    /// endpoint, is replayed there rather than done twice.
    #[arg(long, value_name = "ID")]
    pub request_id: Option<String>,
    /// Budget of the session's model calls' cost, in USD (`2.50`; exact, at
    /// most 12 decimals). A child's may only narrow its parent's. Default:
    /// none of its own (its ancestors' still bound it).
    #[arg(long, value_name = "USD", value_parser = parse_usd)]
    pub budget_usd: Option<u64>,
    /// Budget of model tokens (input, output and cache together).
    #[arg(long, value_name = "N")]
    pub budget_tokens: Option<u64>,
    /// Budget of model calls.
    #[arg(long, value_name = "N")]
    pub budget_calls: Option<u64>,
    /// Wall-clock budget, in seconds from its creation: past it the session
    /// and its subtree end (end reason `budget`).
    #[arg(long, value_name = "SECS")]
    pub budget_wall_secs: Option<u64>,
    /// A directory under /workspace the session's agent may write (repeat
    /// for several); the kernel refuses its writes anywhere else but its
    /// $HOME and $TMPDIR. A child's must lie inside its parent's scope.
    /// Default: the parent's scope for a child, the whole workspace for a root.
    #[arg(long = "writable", value_name = "PATH", value_parser = parse_writable)]
    pub writable: Vec<String>,
    /// What happens to a child when its parent ends, however it ends:
    /// terminate (it ends too), abandon (it keeps running, orphaned; its
    /// budgets and deadline still hold) or notify (as abandon, and it is sent
    /// a parent_ended message). A root has no parent: it takes none.
    #[arg(
        long,
        value_name = "POLICY",
        env = "TROUPE_ON_PARENT_END",
        default_value = "terminate",
        value_parser = parse_parent_end
    )]
    pub on_parent_end: ParentEndPolicy,
}

/// Parses a parent-end policy (`terminate`, `abandon`, `notify`).
fn parse_parent_end(text: &str) -> Result<ParentEndPolicy, String> {
    troupe_proto::status::parse_parent_end(text)
        .ok_or_else(|| format!("{text:?} is not a policy: use terminate, abandon or notify"))
}

/// Checks and normalises a writable path.
fn parse_writable(text: &str) -> Result<String, String> {
    troupe_proto::scope::WritablePath::parse(text).map(|p| p.to_string())
}

/// Parses decimal USD into pico-dollars, exactly.
fn parse_usd(text: &str) -> Result<u64, String> {
    troupe_proto::money::parse_decimal(text, 12).map_err(|e| e.to_string())
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[arg(long)]
    pub workspace: String,
    /// Include completed, failed and terminated sessions.
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Args)]
pub struct TreeArgs {
    /// Any session of the tree.
    pub id: String,
    /// Show only the subtree rooted at ID instead of the whole tree.
    #[arg(long)]
    pub subtree: bool,
    /// Keep watching the tree and reprint it on every change (Ctrl-C ends).
    #[arg(long)]
    pub follow: bool,
}

#[derive(Debug, Args)]
pub struct TerminateArgs {
    pub id: String,
    /// Why (default "manual").
    #[arg(long, default_value = "")]
    pub reason: String,
}

#[derive(Debug, Args)]
pub struct SendArgs {
    pub id: String,
    #[arg(long)]
    pub message: String,
    /// Makes the call safe to retry: the same id and message give the same
    /// answer, and the message is stored once. Default: a fresh id.
    #[arg(long, value_name = "ID")]
    pub request_id: Option<String>,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Only this session's events.
    #[arg(long, value_name = "ID", conflicts_with_all = ["tree", "workspace"])]
    pub session: Option<String>,
    /// Only this tree's events (`tree_...`).
    #[arg(long, value_name = "ID", conflicts_with = "workspace")]
    pub tree: Option<String>,
    /// Only this workspace's events. Without a filter: every event the caller may see.
    #[arg(long, value_name = "W")]
    pub workspace: Option<String>,
    /// Resume after this cursor, as the last event's `cursor` gave it
    /// (`shard:position` pairs; none: from the oldest event kept).
    #[arg(
        long,
        value_name = "CURSOR",
        default_value = "",
        conflicts_with = "live"
    )]
    pub after: String,
    /// Only events that happen from now on.
    #[arg(long)]
    pub live: bool,
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Only entries whose caller or target is this session.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// Only entries after this entry id.
    #[arg(long, value_name = "ID", default_value_t = 0)]
    pub after: u64,
    /// At most this many entries (server default 100, at most 10000).
    #[arg(long, value_name = "N", default_value_t = 0, hide_default_value = true)]
    pub limit: u32,
}

/// Parses a trust level with the protocol's own rules (aliases included).
fn parse_trust(text: &str) -> Result<TrustLevel, String> {
    troupe_proto::trust::parse(text).ok_or_else(|| {
        format!("unknown trust level {text:?}: expected direct, sandboxed, trusted or untrusted")
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn json_flag_is_accepted_after_the_subcommand() {
        let cli = Cli::try_parse_from(["troupe", "session", "get", "sess_1", "--json"]).unwrap();
        assert!(cli.global.json);
    }

    #[test]
    fn endpoints_are_split_on_commas_and_repeated_flags() {
        let cli = Cli::try_parse_from([
            "troupe",
            "--endpoint",
            "http://a:1,http://b:2",
            "--endpoint",
            "unix:///s",
            "audit",
        ])
        .unwrap();
        assert_eq!(
            cli.global.endpoint,
            ["http://a:1", "http://b:2", "unix:///s"]
        );
    }

    #[test]
    fn get_takes_raw() {
        let cli = Cli::try_parse_from(["troupe", "session", "get", "sess_1", "--raw"]).unwrap();
        let Command::Session {
            command: SessionCommand::Get(args),
        } = cli.command
        else {
            panic!("a get: {cli:?}");
        };
        assert!(args.raw);
    }

    #[test]
    fn bad_trust_text_lists_accepted_values() {
        let err = Cli::try_parse_from([
            "troupe",
            "session",
            "create",
            "--workspace",
            "w",
            "--agent",
            "a",
            "--trust-level",
            "root",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("direct, sandboxed, trusted or untrusted"),
            "{err}"
        );
    }
}
