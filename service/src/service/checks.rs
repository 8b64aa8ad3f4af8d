//! What every handler checks alike: request ids, lengths, the operator,
//! and the audit entry of an allowed decision.

use sha2::{Digest, Sha256};

use super::MAX_SHORT_TEXT;
use crate::{
    error::{Reason, SessionError},
    model::{AuditRecord, Caller, Idempotency},
};

/// Builds the idempotency key of a call, or none without a request id; an
/// earlier call's record older than `retention` no longer counts.
pub(super) fn idempotency(
    caller: &Caller,
    action: crate::model::Action,
    request_id: &str,
    payload: &[&str],
    retention: std::time::Duration,
) -> Result<Option<Idempotency>, SessionError> {
    if request_id.is_empty() {
        return Ok(None);
    }
    check_len("request_id", request_id, MAX_SHORT_TEXT)?;
    let mut hash = Sha256::new();
    for part in payload {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    Ok(Some(Idempotency {
        caller: caller.principal(),
        action,
        request_id: request_id.to_owned(),
        payload_hash: hex::encode(hash.finalize()),
        window_start_ms: crate::model::now_ms()
            .saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX)),
    }))
}

pub(super) fn check_len(field: &'static str, value: &str, max: usize) -> Result<(), SessionError> {
    if value.len() > max {
        return Err(SessionError::invalid(
            field,
            format!("{} bytes is over the limit of {max}", value.len()),
        ));
    }
    Ok(())
}

/// An allowed decision made inside a store transaction.
pub(super) fn allowed(
    caller: &Caller,
    action: crate::model::Action,
    target: &str,
    detail: String,
) -> AuditRecord {
    AuditRecord {
        caller: caller.principal(),
        action,
        target: target.to_owned(),
        allowed: true,
        reason: "OK".to_owned(),
        detail,
    }
}

pub(super) fn require_operator(caller: &Caller) -> Result<(), SessionError> {
    match caller {
        Caller::Operator => Ok(()),
        Caller::Session(_) => Err(SessionError::refused(
            Reason::OperatorOnly,
            "this call needs the operator token",
        )),
    }
}
