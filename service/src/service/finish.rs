//! `FinishSession`: a session ends its own task with its result.
//! [`Finishing`]: the longest result (`--max-result-bytes`) and the grace a
//! finished session's process has to exit before it is stopped
//! (`--finish-grace-ms`).

use troupe_proto::session as pb;

use super::{Inner, allowed, view};
use crate::{
    error::{Reason, SessionError},
    model::{Action, Caller, Finish, Outcome, now_ms},
    policy,
    store::Store,
};

/// How sessions finish: the longest result, and the grace a finished
/// session's process has to exit before it is stopped.
#[derive(Clone, Copy, Debug)]
pub struct Finishing {
    pub max_result_bytes: usize,
    pub grace: std::time::Duration,
}

pub async fn session<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::FinishSessionRequest,
) -> Result<pb::FinishSessionResponse, SessionError> {
    let Caller::Session(me) = caller else {
        return Err(SessionError::refused(
            Reason::SessionOnly,
            "a session finishes its own task: call with its token",
        ));
    };
    let limit = inner.finishing.max_result_bytes;
    if req.result.len() > limit {
        return Err(SessionError::invalid(
            "result",
            format!(
                "{} bytes is over the limit of {limit} bytes (--max-result-bytes); \
                 shorten it, or leave the details in the workspace's files",
                req.result.len()
            ),
        ));
    }
    let outcome = pb::Outcome::try_from(req.outcome)
        .map_err(|_| SessionError::invalid("outcome", "unknown outcome"))?;
    let finish = Finish {
        outcome: Outcome::from_proto(outcome),
        result: req.result.clone(),
    };
    let grace = i64::try_from(inner.finishing.grace.as_millis()).unwrap_or(i64::MAX);
    let audit = allowed(caller, Action::FinishSession, &me.session_id, String::new());
    let (terminated, row) = inner
        .store
        .finish(
            &me.session_id,
            &finish,
            now_ms().saturating_add(grace),
            audit,
            &policy::may_finish,
        )
        .await?;
    // Its descendants' processes stop now, as a termination's do; its own
    // has its grace (the owner stops it after, from the store).
    if let Some(driver) = &inner.driver {
        driver.stop(&row.workspace_id, terminated.clone());
    }
    Ok(pb::FinishSessionResponse {
        session: Some(view::session(caller, &row)),
        terminated_session_ids: terminated.into_iter().map(String::from).collect(),
    })
}
