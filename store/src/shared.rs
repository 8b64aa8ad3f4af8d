//! Decisions both stores make the same way, without I/O: what a request id
//! stores and replays, which recipients of a fan-out have room, the detail
//! of a process change's event, and where an output drop stops.

use std::collections::HashMap;

use serde_json::json;

use super::{Created, InboxCheck, Sent};
use crate::{
    error::{QuotaLeft, SessionError},
    model::{
        Delivered, Ended, EventDetail, FannedOut, Nothing, OutputTruncated, ProcessChange, Reach,
        Reached, Sending, SessionId,
    },
};

/// What each of some inboxes holds not yet delivered, in bytes, by session id.
pub(crate) type Unread = HashMap<SessionId, u64>;

/// Marks the recipients of a fan-out's plan whose inbox would not take
/// `body` (`unread`: what each holds not yet delivered) as
/// [`Reach::InboxFull`]; returns what the rest send, for the sender's rates.
pub(crate) fn fill_inboxes(
    plan: &mut [(SessionId, Reach)],
    unread: &Unread,
    body: &str,
    inbox: InboxCheck<'_>,
) -> Sending {
    let bytes = body.len() as u64;
    for (session_id, reach) in plan.iter_mut() {
        let held = unread.get(session_id.as_str()).copied().unwrap_or(0);
        if *reach == Reach::Deliver && inbox(held, bytes).is_err() {
            *reach = Reach::InboxFull;
        }
    }
    let delivered = plan.iter().filter(|(_, r)| *r == Reach::Deliver).count();
    Sending::to_each(delivered, body)
}

/// The detail of a delivery's event (`EventKind::Delivered`): the inbox's
/// messages up to `through` are the agent's now.
pub(crate) fn delivered_detail(through: u64) -> EventDetail {
    EventDetail::Delivered(Delivered {
        through_sequence: through,
    })
}

/// The quota left, as a create's idempotency record stores it.
pub(crate) fn quota_json(q: &QuotaLeft) -> serde_json::Value {
    json!([
        q.tree_sessions_remaining,
        q.depth_remaining,
        q.children_remaining
    ])
}

/// What a create stores under its request id.
pub(crate) fn create_record(session_id: &str, quota: &QuotaLeft) -> serde_json::Value {
    json!({"session_id": session_id, "quota": quota_json(quota)})
}

/// What a send stores under its request id.
pub(crate) fn sent_record(message_id: &str, sequence: u64) -> serde_json::Value {
    json!({"message_id": message_id, "sequence": sequence})
}

/// The earlier call's answer under a request id: its stored `result` if
/// it asked for the same (`hash`), a conflict if not.
pub(crate) fn earlier_answer(
    idem: &crate::model::Idempotency,
    hash: &str,
    result: &str,
) -> Result<serde_json::Value, SessionError> {
    if hash != idem.payload_hash {
        return Err(SessionError::refused(
            crate::error::Reason::IdempotencyConflict,
            format!(
                "request_id {:?} was already used with a different payload",
                idem.request_id
            ),
        ));
    }
    serde_json::from_str(result)
        .map_err(|e| SessionError::Internal(format!("bad idempotency record: {e}")))
}

fn bad_record() -> SessionError {
    SessionError::Internal("bad idempotency record".to_owned())
}

/// A create's answer replayed from its idempotency record.
pub(crate) fn replayed_create(result: &serde_json::Value) -> Result<Created, SessionError> {
    let session_id = result["session_id"]
        .as_str()
        .ok_or_else(bad_record)?
        .to_owned();
    let q = |i: usize| {
        result["quota"][i]
            .as_u64()
            .map(|v| v as u32)
            .ok_or_else(bad_record)
    };
    Ok(Created::Replayed {
        session_id,
        quota: QuotaLeft {
            tree_sessions_remaining: q(0)?,
            depth_remaining: q(1)?,
            children_remaining: q(2)?,
        },
    })
}

/// A send's answer replayed from its idempotency record.
pub(crate) fn replayed_sent(result: &serde_json::Value) -> Result<Sent, SessionError> {
    Ok(Sent {
        message_id: result["message_id"]
            .as_str()
            .ok_or_else(bad_record)?
            .to_owned(),
        sequence: result["sequence"].as_u64().ok_or_else(bad_record)?,
        replayed: true,
    })
}

/// What a message to many stores under its request id, and as its audit
/// entry's detail: each recipient and what it got.
pub(crate) fn fan_out_record(reached: &[Reached]) -> serde_json::Value {
    let entries: Vec<serde_json::Value> = reached
        .iter()
        .map(|r| match r {
            Reached::Delivered {
                session_id,
                message_id,
                sequence,
            } => json!({"session_id": session_id, "message_id": message_id, "sequence": sequence}),
            Reached::Ended { session_id } => json!({"session_id": session_id, "ended": true}),
            Reached::InboxFull { session_id } => {
                json!({"session_id": session_id, "inbox_full": true})
            }
        })
        .collect();
    json!({ "recipients": entries })
}

/// A message to many's answer replayed from its idempotency record.
pub(crate) fn replayed_fan_out(result: &serde_json::Value) -> Result<FannedOut, SessionError> {
    let entries = result["recipients"].as_array().ok_or_else(bad_record)?;
    let reached = entries
        .iter()
        .map(|e| {
            let session_id = e["session_id"].as_str().ok_or_else(bad_record)?.to_owned();
            if e["ended"].as_bool() == Some(true) {
                return Ok(Reached::Ended {
                    session_id: session_id.into(),
                });
            }
            if e["inbox_full"].as_bool() == Some(true) {
                return Ok(Reached::InboxFull {
                    session_id: session_id.into(),
                });
            }
            Ok(Reached::Delivered {
                session_id: session_id.into(),
                message_id: e["message_id"].as_str().ok_or_else(bad_record)?.to_owned(),
                sequence: e["sequence"].as_u64().ok_or_else(bad_record)?,
            })
        })
        .collect::<Result<Vec<_>, SessionError>>()?;
    Ok(FannedOut {
        reached,
        replayed: true,
    })
}

/// The detail of the event a process change writes (output's is written
/// with its budgets, in `output.rs`). A truncation's gap is
/// `gap_from..=runner_seq`, marked where it is.
pub(crate) fn event_detail(change: &ProcessChange, runner_seq: u64, gap_from: u64) -> EventDetail {
    match change {
        ProcessChange::Started | ProcessChange::Output { .. } => EventDetail::Nothing(Nothing {}),
        ProcessChange::Truncated { log_bytes } => EventDetail::OutputTruncated(OutputTruncated {
            dropped_bytes: *log_bytes,
            dropped_events: (runner_seq + 1).saturating_sub(gap_from),
            by_runner: true,
        }),
        ProcessChange::Exited(exit) => EventDetail::Ended(Ended {
            exit_code: exit.code,
            reason: exit.reason.as_str().to_owned(),
            detail: exit.detail.clone(),
        }),
    }
}

/// Session ids as the JSON array of texts that `any_of!` reads.
pub(crate) fn json_ids<'a>(ids: impl IntoIterator<Item = &'a str>) -> String {
    serde_json::Value::from_iter(ids).to_string()
}

/// Where an output drop brings what is kept: three quarters of the budget,
/// so drops (and the marker's move) come once per quarter of it, not per
/// event.
pub(crate) fn low_water(budget: u64) -> i64 {
    (budget - budget / 4).min(i64::MAX as u64) as i64
}
