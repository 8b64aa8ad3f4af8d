//! `GetSession`.

use troupe_proto::session as pb;

use super::{Inner, view};
use crate::{error::SessionError, model::Caller, policy::can_see, store::Store};

pub async fn session<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::GetSessionRequest,
) -> Result<pb::GetSessionResponse, SessionError> {
    let row = inner
        .store
        .get_session(&req.session_id)
        .await?
        .filter(|row| can_see(caller, row))
        .ok_or_else(|| SessionError::not_found(&req.session_id))?;
    let children = inner.store.children(&row.session_id).await?;
    Ok(pb::GetSessionResponse {
        session: Some(view::session(caller, &row)),
        children: children
            .iter()
            .filter(|child| can_see(caller, child))
            .map(|child| view::session(caller, child))
            .collect(),
        inbox_count: inner.store.inbox_count(&row.session_id).await?,
    })
}
