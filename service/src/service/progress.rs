//! `ReportProgress`: a session tells how far its own task has come.

use troupe_proto::session as pb;

use super::{Inner, MAX_SHORT_TEXT, allowed, check_len};
use crate::{
    error::{Reason, SessionError},
    model::{Action, Caller, ProgressReport},
    policy,
    store::Store,
};

pub async fn report<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::ReportProgressRequest,
) -> Result<pb::ReportProgressResponse, SessionError> {
    let Caller::Session(me) = caller else {
        return Err(SessionError::refused(
            Reason::SessionOnly,
            "a session reports its own progress: call with its token",
        ));
    };
    if req.progress > 100 {
        return Err(SessionError::invalid(
            "progress",
            format!("{} is not a percentage (0 to 100)", req.progress),
        ));
    }
    check_len("description", &req.description, MAX_SHORT_TEXT)?;
    let report = ProgressReport {
        progress: req.progress,
        description: req.description.clone(),
    };
    let audit = allowed(
        caller,
        Action::ReportProgress,
        &me.session_id,
        format!("{}%", req.progress),
    );
    let sequence = inner
        .store
        .record_progress(&me.session_id, report, audit, &policy::may_report_progress)
        .await?;
    Ok(pb::ReportProgressResponse { sequence })
}
