//! `ListWorkspaceSessions`.

use troupe_proto::session as pb;

use super::{Inner, view};
use crate::{error::SessionError, model::Caller, policy, store::Store};

/// Page size when the request names none.
pub const DEFAULT_PAGE_SIZE: u32 = 1000;
/// Largest page served.
pub const MAX_PAGE_SIZE: u32 = 10_000;

pub async fn sessions<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::ListWorkspaceSessionsRequest,
) -> Result<pb::ListWorkspaceSessionsResponse, SessionError> {
    let workspace = policy::visible_workspace(caller, &req.workspace_id)?;
    let sandboxed_only = policy::sees_only_sandboxed(caller);
    let after = if req.page_token.is_empty() {
        0
    } else {
        req.page_token
            .parse::<i64>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| SessionError::invalid("page_token", "not a token this service issued"))?
    };
    let limit = match req.page_size {
        0 => DEFAULT_PAGE_SIZE,
        n => n.min(MAX_PAGE_SIZE),
    };
    let (rows, next) = inner
        .store
        .list_workspace(&workspace, sandboxed_only, req.include_ended, after, limit)
        .await?;
    Ok(pb::ListWorkspaceSessionsResponse {
        sessions: rows.iter().map(|row| view::session(caller, row)).collect(),
        next_page_token: next.map(|n| n.to_string()).unwrap_or_default(),
    })
}
