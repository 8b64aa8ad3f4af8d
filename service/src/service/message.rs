//! `SendMessage`: stores a message in the recipient's inbox.
//!
//! `store_and_deliver` is the one path of a single message, `SendMessage`'s
//! and `ReplyToParent`'s: stored and audited in one transaction, counted
//! against the sender's rate, then delivered at once where this replica
//! owns the recipient's runner.

use troupe_proto::session as pb;

use super::{Inner, MAX_MESSAGE_BYTES, allowed, check_len, idempotency};
use crate::{
    error::SessionError,
    model::{Action, Caller, Idempotency, MessageRate, NewMessage, Sending, SessionId},
    policy,
    store::{Bounds, InboxCheck, MessageCheck, RateCheck, Sent, Store, Throttle},
};

/// The bounds a message from `caller` holds: the recipient's inbox, and
/// the rates a session's messages count against (the operator's count
/// against none).
pub(super) fn bounds<'a>(
    caller: &'a Caller,
    rate: RateCheck<'a>,
    inbox: InboxCheck<'a>,
) -> Bounds<'a> {
    let throttle = match caller {
        Caller::Session(me) => Some(Throttle {
            sender: &me.session_id,
            check: rate,
        }),
        Caller::Operator => None,
    };
    Bounds { throttle, inbox }
}

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
        Action::SendMessage,
        &req.request_id,
        &[&req.session_id, &req.message],
        inner.request_id_retention,
    )?;
    let (sent, delivery) = store_and_deliver(
        inner,
        caller,
        Action::SendMessage,
        &SessionId::from(&req.session_id),
        &req.message,
        idem,
        &|target| policy::may_message(caller, target),
    )
    .await?;
    Ok(pb::SendMessageResponse {
        message_id: sent.message_id,
        session_id: req.session_id.clone(),
        sequence: sent.sequence,
        delivery: delivery as i32,
    })
}

/// Stores `body` in `recipient`'s inbox if `check` allows it (audited as
/// `action`), then delivers it at once when this replica owns the
/// recipient's runner: the one path of every message.
pub(super) async fn store_and_deliver<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    action: crate::model::Action,
    recipient: &SessionId,
    body: &str,
    idem: Option<Idempotency>,
    check: MessageCheck<'_>,
) -> Result<(Sent, pb::DeliveryStatus), SessionError> {
    let message = NewMessage {
        message_id: crate::model::new_message_id(),
        sender: caller.principal(),
        body: body.to_owned(),
    };
    let audit = allowed(
        caller,
        action,
        recipient,
        format!("message {}", message.message_id),
    );
    let limits = inner.rules.messaging();
    let rate = |rate: MessageRate, sending: Sending| {
        policy::admit_messages(rate, sending, crate::model::now_ms(), &limits)
    };
    let inbox = |unread: u64, bytes: u64| policy::admit_inbox(unread, bytes, &limits);
    let sent = inner
        .store
        .send_message(
            recipient,
            message,
            idem,
            audit,
            bounds(caller, &rate, &inbox),
            check,
        )
        .await?;
    let delivered = match &inner.driver {
        Some(driver) => driver.deliver(recipient).await,
        None => false,
    };
    if !delivered {
        crate::metrics::queued();
    }
    let delivery = if delivered {
        pb::DeliveryStatus::Delivered
    } else {
        pb::DeliveryStatus::Queued
    };
    Ok((sent, delivery))
}
