//! `IssueSessionToken`: operator only.

use troupe_proto::session as pb;

use super::{Inner, require_operator, view};
use crate::{
    error::{Reason, SessionError},
    model::Caller,
    store::Store,
};

pub async fn issue<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::IssueSessionTokenRequest,
) -> Result<pb::IssueSessionTokenResponse, SessionError> {
    require_operator(caller)?;
    let row = inner
        .store
        .get_session(&req.session_id.as_str().into())
        .await?
        .ok_or_else(|| SessionError::not_found(&req.session_id))?;
    if !row.is_active() {
        return Err(SessionError::refused(
            Reason::SessionEnded,
            format!("session {} has ended; it gets no token", row.session_id),
        ));
    }
    let (token, exp) = inner.tokens.mint(&row.session_id)?;
    Ok(pb::IssueSessionTokenResponse {
        session_token: token,
        expires_at: Some(view::timestamp(exp as i64 * 1000)),
    })
}
