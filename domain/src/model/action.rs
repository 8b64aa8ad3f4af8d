//! What an audit entry (and a request id's record) says was done: each RPC
//! by its name, and what Troupe or the console does of its own. Stored as
//! its name ([`Action::as_str`]), which the audit trail and the console's
//! reads (`action = 'create_session'`) match on.

use std::fmt;

/// An audited action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    CreateRootSession,
    CreateSession,
    SendMessage,
    ListWorkspaceSessions,
    GetSession,
    TerminateSession,
    WatchSessions,
    IssueSessionToken,
    ReportProgress,
    FinishSession,
    ReplyToParent,
    Broadcast,
    CreateGroup,
    AddGroupMembers,
    PostToGroup,
    ListGroups,
    ListAudit,
    ApplyAgent,
    ListAgents,
    RemoveAgent,
    ListRunners,
    ListReplicas,
    RegisterRunner,
    /// A session's end reaching its children (by Troupe).
    ParentEnded,
    /// An ended child's notice written into its parent's inbox (by Troupe).
    Callback,
    /// A subtree ended because its wall-clock budget ran out (by Troupe).
    EndForBudget,
    /// A sign-in to the web console.
    ConsoleSignIn,
    /// A sign-out of the web console.
    ConsoleSignOut,
    /// A root session created from the web console.
    ConsoleCreateRootSession,
    /// A message sent from the web console.
    ConsoleSendMessage,
    /// A termination asked from the web console.
    ConsoleTerminateSession,
    /// An agent's process started, or refused to start (by Troupe).
    StartAgent,
    /// What a new owner found of a process and did (by Troupe).
    Reconcile,
    /// Sessions failed because their runner was lost (by Troupe).
    RunnerLost,
    /// A model call through the gateway.
    ModelCall,
    /// A token count through the gateway.
    CountTokens,
}

impl Action {
    /// The action's stored name: the RPC's, in snake case.
    pub const fn as_str(self) -> &'static str {
        match self {
            Action::CreateRootSession => "create_root_session",
            Action::CreateSession => "create_session",
            Action::SendMessage => "send_message",
            Action::ListWorkspaceSessions => "list_workspace_sessions",
            Action::GetSession => "get_session",
            Action::TerminateSession => "terminate_session",
            Action::WatchSessions => "watch_sessions",
            Action::IssueSessionToken => "issue_session_token",
            Action::ReportProgress => "report_progress",
            Action::FinishSession => "finish_session",
            Action::ReplyToParent => "reply_to_parent",
            Action::Broadcast => "broadcast",
            Action::CreateGroup => "create_group",
            Action::AddGroupMembers => "add_group_members",
            Action::PostToGroup => "post_to_group",
            Action::ListGroups => "list_groups",
            Action::ListAudit => "list_audit",
            Action::ApplyAgent => "apply_agent",
            Action::ListAgents => "list_agents",
            Action::RemoveAgent => "remove_agent",
            Action::ListRunners => "list_runners",
            Action::ListReplicas => "list_replicas",
            Action::RegisterRunner => "register_runner",
            Action::ParentEnded => "parent_ended",
            Action::Callback => "callback",
            Action::EndForBudget => "end_for_budget",
            Action::ConsoleSignIn => "console_sign_in",
            Action::ConsoleSignOut => "console_sign_out",
            Action::ConsoleCreateRootSession => "console_create_root_session",
            Action::ConsoleSendMessage => "console_send_message",
            Action::ConsoleTerminateSession => "console_terminate_session",
            Action::StartAgent => "start_agent",
            Action::Reconcile => "reconcile",
            Action::RunnerLost => "runner_lost",
            Action::ModelCall => "model_call",
            Action::CountTokens => "count_tokens",
        }
    }

    /// Whether an allowed call of this action is audited too (the reads
    /// that show what a caller saw); every refusal is.
    pub fn audits_allowed(self) -> bool {
        matches!(
            self,
            Action::ListWorkspaceSessions
                | Action::GetSession
                | Action::WatchSessions
                | Action::IssueSessionToken
                | Action::ListAgents
        )
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
