//! `SendMessage`: stores a message in the recipient's inbox.

use troupe_proto::session as pb;

use super::{Inner, MAX_MESSAGE_BYTES, allowed, check_len, idempotency};
use crate::{
    error::SessionError,
    model::{Caller, NewMessage},
    policy,
    store::Store,
};

pub async fn send<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::SendMessageRequest,
) -> Result<pb::SendMessageResponse, SessionError> {
    if req.session_id.is_empty() {
        return Err(SessionError::invalid("session_id", "must not be empty"));
    }
    if req.message.is_empty() {
        return Err(SessionError::invalid("message", "must not be empty"));
    }
    check_len("message", &req.message, MAX_MESSAGE_BYTES)?;
    let idem = idempotency(
        caller,
        "send_message",
        &req.request_id,
        &[&req.session_id, &req.message],
        inner.request_id_retention,
    )?;
    let message = NewMessage {
        message_id: format!("msg_{}", uuid::Uuid::now_v7().simple()),
        sender: caller.principal(),
        body: req.message.clone(),
    };
    let audit = allowed(
        caller,
        "send_message",
        &req.session_id,
        format!("message {}", message.message_id),
    );
    let sent = inner
        .store
        .send_message(&req.session_id, message, idem, audit, &|target| {
            policy::may_message(caller, target)
        })
        .await?;
    let delivered = match &inner.driver {
        Some(driver) => driver.deliver(&req.session_id).await,
        None => false,
    };
    if !delivered {
        crate::metrics::queued();
    }
    Ok(pb::SendMessageResponse {
        message_id: sent.message_id,
        session_id: req.session_id.clone(),
        sequence: sent.sequence,
        delivery: if delivered {
            pb::DeliveryStatus::Delivered
        } else {
            pb::DeliveryStatus::Queued
        } as i32,
    })
}
