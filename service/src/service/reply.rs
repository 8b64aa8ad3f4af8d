//! `ReplyToParent`: a session messages its own parent, which it need not
//! be able to see.

use troupe_proto::session as pb;

use super::{Inner, MAX_MESSAGE_BYTES, check_len, idempotency, message};
use crate::{
    error::{Reason, SessionError},
    model::{Action, Caller},
    policy,
    store::Store,
};

pub async fn send<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::ReplyToParentRequest,
) -> Result<pb::ReplyToParentResponse, SessionError> {
    let Caller::Session(me) = caller else {
        return Err(SessionError::refused(
            Reason::SessionOnly,
            "a session replies to its own parent: call with its token",
        ));
    };
    // The parent is the caller's row's, never a name the caller gives.
    let Some(parent) = me.parent_session_id.clone() else {
        return Err(SessionError::refused(
            Reason::NoParent,
            "a root session has no parent to reply to",
        ));
    };
    if req.message.is_empty() {
        return Err(SessionError::invalid("message", "must not be empty"));
    }
    check_len("message", &req.message, MAX_MESSAGE_BYTES)?;
    let idem = idempotency(
        caller,
        Action::ReplyToParent,
        &req.request_id,
        &[&req.message],
        inner.request_id_retention,
    )?;
    let (sent, delivery) = message::store_and_deliver(
        inner,
        caller,
        Action::ReplyToParent,
        &parent,
        &req.message,
        idem,
        &|target| policy::may_reply(me, target),
    )
    .await?;
    Ok(pb::ReplyToParentResponse {
        message_id: sent.message_id,
        sequence: sent.sequence,
        delivery: delivery as i32,
    })
}
