//! The tools. Names and arguments follow the seeds (`create_session`,
//! `send_message`, `list_workspace_sessions`) plus `get_session`,
//! `wait_for_session`, `terminate_session`, `report_progress`, and the two
//! of a child towards its parent, `finish` and `reply_to_parent`, and those of
//! messages to many (`groups`): `broadcast`, `create_group`, `add_to_group`,
//! `post_to_group`, `list_groups`. Each validates only what it
//! must to build the request; the session service decides everything else.
//! Results are pretty JSON text with the same value as structured content;
//! failures are tool errors ([`crate::failure`]).
//!
//! [`args`] holds the arguments, [`calls`] what each tool does (`own`:
//! those about the caller's own session); this file
//! holds the tools' names and descriptions, and the server's.

mod args;
mod calls;
mod groups;
mod own;

use std::sync::Arc;

use rmcp::{
    ErrorData, ServerHandler,
    handler::server::{router::tool::ToolRouter, wrapper::Parameters},
    model::{CallToolResult, Extensions, Implementation, ServerCapabilities, ServerConfig},
    tool, tool_handler, tool_router,
};

pub use args::{
    AddToGroupArgs, BroadcastArgs, CreateGroupArgs, CreateSessionArgs, DEFAULT_WAIT_SECS,
    FinishArgs, FinishOutcome, ListArgs, MAX_WAIT_SECS, Mode, PostToGroupArgs, ProgressArgs,
    ReplyArgs, Scope, SendMessageArgs, SessionArgs, Usd, WaitArgs, Whole,
};

use crate::{backend::Backend, caller::Identity};

const INSTRUCTIONS: &str = "Troupe sessions: this server acts as the calling agent's own session. \
Use create_session to start a child agent in this workspace, send_message to talk to another \
session, list_workspace_sessions to discover the team, get_session and wait_for_session to \
follow a session, terminate_session to end one below you, report_progress to tell watchers \
how far your own task has come, reply_to_parent to tell your parent something while you work, \
and finish to end your own task with its result, which your parent receives. broadcast sends \
one message to many sessions at once; create_group, add_to_group, post_to_group and list_groups \
keep named groups to talk to. The session \
service enforces every \
rule (workspace, trust level, spawn limits); a refused call is a tool error saying which rule \
refused it and what quota is left.";

/// The MCP server: the tools, acting with the caller's token.
#[derive(Clone)]
pub struct Bridge {
    backend: Arc<Backend>,
    identity: Identity,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Bridge {
    #[tool(
        name = "create_session",
        description = "Create a child session: start another agent in this workspace, as a \
child of the calling session. The child inherits the workspace, and this session's trust level \
unless trust_level narrows it (a sandboxed session creates only sandboxed children). The session \
service enforces the spawn limits (tree depth, sessions per tree, children per session, active \
sessions per workspace, spawn rate); a refusal says which limit and what is left. budget_usd, \
budget_tokens, budget_calls and budget_wall_secs optionally give the child a budget for its whole \
subtree; a child's budget can only narrow this session's: each must be at most what this session \
(and its ancestors) has left, or the call is refused BUDGET_EXCEEDED with what is left. \
writable_paths optionally confines the child's writes to directories under /workspace (enforced by \
the kernel; its $HOME and $TMPDIR stay writable); each must lie inside this session's own write \
scope, which a child given none inherits (else SCOPE_ESCALATION); a sandboxed child of a direct \
session given none writes only /workspace/sandboxed. on_parent_end says what happens \
to the child when this session ends, however it ends: \"terminate\" (default), \"abandon\" (it keeps \
running, orphaned) or \"notify\" (as abandon, and it receives a parent_ended message). Returns the new \
session (session_id, status, depth, trust_level, ...), the quota left after it, and for mode \
\"sync\" the child's result (status, exit_code, output_tail, and finished: the outcome and \
result the child gave with its finish tool).",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            open_world_hint = false
        )
    )]
    async fn create_session(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<CreateSessionArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced(
            "create_session",
            &extensions,
            self.create(&extensions, args),
        )
        .await
    }

    #[tool(
        name = "send_message",
        description = "Send a message to another session of this workspace (a child, the \
parent, a sibling). It is stored in the recipient's inbox and written to its agent's input when \
that agent runs. A sandboxed session can message only sandboxed sessions. Returns delivery: \
\"delivered\" (written to the running agent now) or \"queued\" (stored; the agent gets it when \
it runs).",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            open_world_hint = false
        )
    )]
    async fn send_message(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<SendMessageArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced("send_message", &extensions, self.send(&extensions, args))
            .await
    }

    #[tool(
        name = "list_workspace_sessions",
        description = "List the sessions of this workspace that the calling session may see \
(a sandboxed session sees only sandboxed sessions): id, title, agent, status, trust level, depth \
and parent of each. Active sessions only, unless include_ended is true.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_workspace_sessions(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<ListArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced(
            "list_workspace_sessions",
            &extensions,
            self.list(&extensions, args),
        )
        .await
    }

    #[tool(
        name = "get_session",
        description = "Get one session this session may see: its status, exit code, the \
tail of its output and, once it used its finish tool, its outcome and result (in \
result.finished), and its direct children.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn get_session(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<SessionArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced(
            "get_session",
            &extensions,
            self.get(&extensions, &args.session_id),
        )
        .await
    }

    #[tool(
        name = "wait_for_session",
        description = "Wait until a session has ended (completed, failed or terminated) or \
timeout_s seconds have passed (default 300, at most 3600). Returns what get_session returns, \
plus timed_out (true when the session was still active at the deadline) and waited_s.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn wait_for_session(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<WaitArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced(
            "wait_for_session",
            &extensions,
            self.wait(&extensions, args),
        )
        .await
    }

    #[tool(
        name = "terminate_session",
        description = "Terminate a session below the calling one in its spawn tree (a child or \
any descendant), and with it every active session under it. Returns the ids of the sessions it \
ended. Terminating a session that has already ended is harmless.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn terminate_session(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<SessionArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced(
            "terminate_session",
            &extensions,
            self.terminate(&extensions, &args.session_id),
        )
        .await
    }

    #[tool(
        name = "report_progress",
        description = "Report how far this session's own task has come: progress in percent \
(0 to 100) and, optionally, a few words on what is being done. Whoever watches the spawn tree \
(the parent, an operator) sees it as a progress event of this session. Returns the event's \
sequence.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn report_progress(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<ProgressArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced(
            "report_progress",
            &extensions,
            self.progress(&extensions, args),
        )
        .await
    }
    #[tool(
        name = "finish",
        description = "Finish this session's own task: give its result (the answer, in \
full; the parent receives exactly this text) and its outcome, \"success\" (default) or \
\"failure\". This session then ends (completed or failed), its children still running are \
terminated, and this agent is stopped shortly after: call it last, once. The parent gets the \
result however it waits (a sync create, its callback message, get_session or \
wait_for_session). A result over the service's limit (64 KiB by default) is refused; \
finishing twice is refused (SESSION_ENDED).",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn finish(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<FinishArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced("finish", &extensions, self.finish_own(&extensions, args))
            .await
    }

    #[tool(
        name = "reply_to_parent",
        description = "Send a message to this session's own parent (the session that created \
it), while the task goes on: a question, an intermediate finding, a status. It needs no \
session id and works whatever the trust levels: it is the one message a sandboxed session may \
send a direct parent. The parent receives it once, from this session. A root session has no \
parent (refused NO_PARENT); a parent that has ended takes no reply (PARENT_NOT_RUNNING). Returns delivery: \"delivered\" or \"queued\".",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn reply_to_parent(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<ReplyArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced(
            "reply_to_parent",
            &extensions,
            self.reply(&extensions, args),
        )
        .await
    }

    #[tool(
        name = "broadcast",
        description = "Send one message to many sessions at once: every active session of \
this workspace this session may message (scope \"workspace\", the default), or only its own \
descendants (\"subtree\") or direct children (\"children\"). Never this session itself. The \
rule is send_message's for every recipient: a sandboxed session reaches only sandboxed \
sessions (not even its direct parent: use reply_to_parent for that). Each recipient gets it \
once. Every recipient counts against this session's message rate, and one message reaches at \
most the service's fan-out limit (64 by default): past either, nothing is sent and the call \
is refused (RATE_LIMITED, FAN_OUT_EXCEEDED); the rate counts bytes too, the whole message \
once per recipient. Returns each recipient and what it got: \"delivered\" (message_id, \
sequence, delivery), \"ended\", or \"inbox_full\" (it has too much unread: nothing stored).",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn broadcast(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<BroadcastArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced(
            "broadcast",
            &extensions,
            self.broadcast_to(&extensions, args),
        )
        .await
    }

    #[tool(
        name = "create_group",
        description = "Create a named group in this workspace, with this session as its first \
member; add members with add_to_group and message them all with post_to_group. Names are \
unique per workspace (another session's name is refused GROUP_EXISTS; creating your own again \
returns it). Returns the group: name and the member ids this session may see.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn create_group(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<CreateGroupArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced(
            "create_group",
            &extensions,
            self.group_create(&extensions, args),
        )
        .await
    }

    #[tool(
        name = "add_to_group",
        description = "Add sessions to a group this session is a member of. Each must be a \
session this session may message (a sandboxed session adds only sandboxed ones); if one is \
not, none is added. Members already in stay. Returns the group.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn add_to_group(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<AddToGroupArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced(
            "add_to_group",
            &extensions,
            self.group_add(&extensions, args),
        )
        .await
    }

    #[tool(
        name = "post_to_group",
        description = "Send one message to the other members of a group this session is a \
member of: each member this session may message, and that may message it back, gets it once (a \
sandboxed member never gets a direct session's post; a member it may not see neither gets it \
nor is named). Limits and answer as broadcast's.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn post_to_group(
        &self,
        extensions: Extensions,
        Parameters(args): Parameters<PostToGroupArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.traced(
            "post_to_group",
            &extensions,
            self.group_post(&extensions, args),
        )
        .await
    }

    #[tool(
        name = "list_groups",
        description = "List the groups this session is a member of, each with the members this \
session may see.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_groups(&self, extensions: Extensions) -> Result<CallToolResult, ErrorData> {
        self.traced("list_groups", &extensions, self.group_list(&extensions))
            .await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Bridge {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("troupe-mcp", env!("CARGO_PKG_VERSION"))
                    .with_title("Troupe sessions"),
            )
            .with_instructions(INSTRUCTIONS)
    }
}
