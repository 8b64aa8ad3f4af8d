//! A workspace's sessions as the console reads them, through
//! `ListWorkspaceSessions` as the operator: all of them (the workspaces'
//! counts), or a tree's snapshot one page at a time, so that no answer
//! grows with the workspace: at most [`PAGE_SESSIONS`] sessions and
//! [`PAGE_BYTES`] of their JSON, in the order they were made (a parent
//! before its children), each page naming the next.

use std::collections::HashMap;

use serde_json::Value;
use troupe_proto::session::{self as pb, session_service_server::SessionService};

use super::{
    Console,
    calls::{ApiError, as_operator},
    json,
};
use troupe_domain::model::{Account, SessionActivity, SessionId};
use troupe_service::service::view;
use troupe_store::Store;

/// Sessions a page of a tree's snapshot holds at most.
pub const PAGE_SESSIONS: u32 = 500;
/// Bytes of sessions' JSON a page holds at most: with the first page's
/// refused spawns (the newest thousand), an answer stays under 1 MiB.
pub const PAGE_BYTES: usize = 448 * 1024;
/// Sessions of the workspace read at most for one page of one tree's (the
/// rest of the workspace's are skipped): a page may then hold fewer, or
/// none, and name the next.
const SCAN_SESSIONS: usize = 20_000;
/// Pages a workspace's counts read at most, of [`LIST_PAGE`] sessions.
const MAX_LIST_PAGES: usize = 10;
/// The list RPC's largest page.
const LIST_PAGE: u32 = 10_000;
/// Sessions whose usage one read of the store gives.
const USAGE_BATCH: usize = 1_000;

/// A page of a tree's snapshot: its sessions as the page reads them, and
/// the token of the next page (none after the last).
pub struct Page {
    pub sessions: Vec<Value>,
    pub next: Option<String>,
}

impl<S: Store> Console<S> {
    /// One page of the list RPC: up to `size` sessions after `token`, ended
    /// ones included, and the next page's token.
    async fn list_page(
        &self,
        workspace: &str,
        token: &str,
        size: u32,
    ) -> Result<(Vec<pb::Session>, Option<String>), ApiError> {
        let request = as_operator(
            self.operator_token(),
            pb::ListWorkspaceSessionsRequest {
                workspace_id: workspace.to_owned(),
                include_ended: true,
                page_size: size,
                page_token: token.to_owned(),
            },
        )?;
        let page = self
            .service
            .list_workspace_sessions(request)
            .await?
            .into_inner();
        let next = Some(page.next_page_token).filter(|t| !t.is_empty());
        Ok((page.sessions, next))
    }

    /// Every session of a workspace the list RPC gives, ended ones included
    /// (up to [`MAX_LIST_PAGES`] of its largest pages).
    pub(super) async fn workspace_sessions(
        &self,
        workspace: &str,
    ) -> Result<Vec<pb::Session>, ApiError> {
        let mut sessions = Vec::new();
        let mut token = String::new();
        for _ in 0..MAX_LIST_PAGES {
            let (page, next) = self.list_page(workspace, &token, LIST_PAGE).await?;
            sessions.extend(page);
            match next {
                Some(next) => token = next,
                None => break,
            }
        }
        Ok(sessions)
    }

    /// Adds each session's usage (its account), as `GetSession` gives it:
    /// one read of the store per [`USAGE_BATCH`] sessions.
    pub(super) async fn with_usage(&self, sessions: &mut [pb::Session]) -> Result<(), ApiError> {
        for batch in sessions.chunks_mut(USAGE_BATCH) {
            let ids: Vec<SessionId> = batch
                .iter()
                .map(|s| SessionId::from(&s.session_id))
                .collect();
            let accounts: HashMap<SessionId, Account> = self
                .inner
                .store
                .accounts(&ids)
                .await?
                .into_iter()
                .map(|a| (a.session_id.clone(), a))
                .collect();
            for session in batch {
                if let Some(account) = accounts.get(session.session_id.as_str()) {
                    view::with_account(session, account);
                }
            }
        }
        Ok(())
    }

    /// The inbox and last progress of each of `sessions`, by id.
    async fn activity(
        &self,
        sessions: &[pb::Session],
    ) -> Result<HashMap<SessionId, SessionActivity>, ApiError> {
        let ids: Vec<SessionId> = sessions
            .iter()
            .map(|s| SessionId::from(&s.session_id))
            .collect();
        Ok(self
            .inner
            .store
            .sessions_activity(&ids)
            .await?
            .into_iter()
            .map(|a| (a.session_id.clone(), a))
            .collect())
    }

    /// The page of `workspace`'s sessions (of `tree`'s, if named) after
    /// `after` (a page's `next`; empty for the first), each with its usage,
    /// inbox and last progress.
    pub(super) async fn tree_page(
        &self,
        workspace: &str,
        tree: Option<&str>,
        after: &str,
    ) -> Result<Page, ApiError> {
        let trace = self.settings.trace_url.as_ref();
        let mut sessions: Vec<Value> = Vec::new();
        let mut bytes = 0;
        let mut scanned = 0;
        let mut token = after.to_owned();
        let mut size = PAGE_SESSIONS;
        loop {
            let (mut chunk, next) = self.list_page(workspace, &token, size).await?;
            let read = chunk.len();
            if let Some(tree) = tree {
                chunk.retain(|s| s.tree_id == tree);
            }
            self.with_usage(&mut chunk).await?;
            let activity = self.activity(&chunk).await?;
            let nodes: Vec<Value> = chunk
                .iter()
                .map(|s| json::tree_node(s, trace, activity.get(s.session_id.as_str())))
                .collect();
            let chunk_bytes: usize = nodes.iter().map(|n| n.to_string().len() + 1).sum();
            if bytes + chunk_bytes > PAGE_BYTES {
                if !sessions.is_empty() {
                    // The next page starts with this chunk.
                    return Ok(Page {
                        sessions,
                        next: Some(token),
                    });
                }
                if size > 1 {
                    // Fewer of the same sessions (the list's order is fixed).
                    size /= 2;
                    continue;
                }
            }
            sessions.extend(nodes);
            bytes += chunk_bytes;
            scanned += read;
            let Some(next) = next else {
                return Ok(Page {
                    sessions,
                    next: None,
                });
            };
            // A tree's page reads on until it is half full (the next
            // chunk, of what it lacks, then fills it at most).
            let half = sessions.len() >= PAGE_SESSIONS as usize / 2;
            if tree.is_none() || half || scanned >= SCAN_SESSIONS {
                return Ok(Page {
                    sessions,
                    next: Some(next),
                });
            }
            token = next;
            size = PAGE_SESSIONS - u32::try_from(sessions.len()).unwrap_or(PAGE_SESSIONS);
        }
    }
}
