//! `ListAudit`: operator only.

use troupe_proto::session as pb;

use super::{Inner, require_operator, view};
use crate::{
    error::SessionError,
    model::{Caller, SessionId},
    store::Store,
};

pub async fn list<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::ListAuditRequest,
) -> Result<pb::ListAuditResponse, SessionError> {
    require_operator(caller)?;
    let limit = match req.limit {
        0 => 100,
        n => n.min(10_000),
    };
    let session = (!req.session_id.is_empty()).then(|| SessionId::from(&req.session_id));
    let rows = inner
        .store
        .list_audit(
            session.as_ref(),
            req.after_id.min(i64::MAX as u64) as i64,
            limit,
        )
        .await?;
    Ok(pb::ListAuditResponse {
        entries: rows.into_iter().map(view::audit_entry).collect(),
    })
}
