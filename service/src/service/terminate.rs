//! `TerminateSession`: ends a session; its children apply their parent-end policies.

use troupe_proto::session as pb;

use super::{Inner, MAX_SHORT_TEXT, allowed, check_len, view};
use crate::{
    error::SessionError,
    model::{Action, Caller},
    policy,
    store::Store,
};

pub async fn session<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::TerminateSessionRequest,
) -> Result<pb::TerminateSessionResponse, SessionError> {
    if req.session_id.is_empty() {
        return Err(SessionError::invalid("session_id", "must not be empty"));
    }
    check_len("reason", &req.reason, MAX_SHORT_TEXT)?;
    let reason = if req.reason.trim().is_empty() {
        "manual"
    } else {
        req.reason.trim()
    };
    let audit = allowed(
        caller,
        Action::TerminateSession,
        &req.session_id,
        String::new(),
    );
    let (ended, row) = inner
        .store
        .terminate(
            &req.session_id.as_str().into(),
            &caller.principal(),
            reason,
            audit,
            &|target, ancestors| policy::may_terminate(caller, target, ancestors),
        )
        .await?;
    if let Some(driver) = &inner.driver {
        driver.stop(&row.workspace_id, ended.clone());
    }
    Ok(pb::TerminateSessionResponse {
        terminated_session_ids: ended.into_iter().map(String::from).collect(),
        session: Some(view::session(caller, &row)),
    })
}
