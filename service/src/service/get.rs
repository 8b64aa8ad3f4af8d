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
        .get_session(&req.session_id.as_str().into())
        .await?
        .filter(|row| can_see(caller, row))
        .ok_or_else(|| SessionError::not_found(&req.session_id))?;
    let children = inner.store.children(&row.session_id).await?;
    let process = inner.store.process(&row.session_id).await?;
    let mut session = view::session(caller, &row);
    session.exit_code = process.as_ref().and_then(|p| p.exit_code);
    if let Some(account) = inner.store.account(&row.session_id).await? {
        view::with_account(&mut session, &account);
    }
    Ok(pb::GetSessionResponse {
        result: Some(view::result(
            &row,
            process.as_ref(),
            inner.store.finished(&row.session_id).await?.as_ref(),
        )),
        session: Some(session),
        children: children
            .iter()
            .filter(|child| can_see(caller, child))
            .map(|child| view::session(caller, child))
            .collect(),
        inbox_count: inner.store.inbox_count(&row.session_id).await?,
        unread_count: inner.store.unread_count(&row.session_id).await?,
    })
}
