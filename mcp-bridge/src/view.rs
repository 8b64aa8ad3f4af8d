//! The JSON the tools return, made for a model to read: enums as lowercase
//! words (`running`, `sandboxed`, `queued`), timestamps as RFC 3339 UTC,
//! absent values as `null`; a session is [`troupe_proto::view`]'s.

use serde_json::{Value, json};
use troupe_proto::{
    session::{self as pb, DeliveryStatus},
    status::{is_ended, status_str},
    view::{self, quota},
};

/// One session: [`view::session`] and whether it has `ended`.
pub fn session(s: &pb::Session) -> Value {
    let mut fields = view::session(s);
    fields.insert("ended".to_owned(), is_ended(s.status()).into());
    Value::Object(fields)
}

fn opt_session(s: Option<&pb::Session>) -> Value {
    s.map_or(Value::Null, session)
}

/// How a session ended (or what it printed so far), with its own result
/// (`finished`: outcome and result) if it finished its task, else `null`.
pub fn result(r: Option<&pb::SessionResult>) -> Value {
    r.map_or(Value::Null, |r| {
        json!({
            "status": status_str(r.status()),
            "exit_code": r.exit_code,
            "output_tail": r.output_tail,
            "finished": r.finished.as_ref().map_or(Value::Null, |f| json!({
                "outcome": outcome_str(f.outcome()),
                "result": f.result,
            })),
        })
    })
}

fn outcome_str(outcome: pb::Outcome) -> &'static str {
    match outcome {
        pb::Outcome::Success => "success",
        pb::Outcome::Failure => "failure",
        pb::Outcome::Unspecified => "unspecified",
    }
}

/// This session's own end.
pub fn finished(r: &pb::FinishSessionResponse) -> Value {
    json!({
        "session": opt_session(r.session.as_ref()),
        "terminated_session_ids": r.terminated_session_ids,
        "note": "your task is over: the parent has the result; your process is stopped soon",
    })
}

/// A reply sent to the parent.
pub fn replied(r: &pb::ReplyToParentResponse) -> Value {
    let (delivery, note) = delivery(r.delivery());
    json!({
        "message_id": r.message_id,
        "sequence": r.sequence,
        "delivery": delivery,
        "note": note,
    })
}

/// A delivery status as a word, and what it means.
fn delivery(status: DeliveryStatus) -> (&'static str, &'static str) {
    match status {
        DeliveryStatus::Delivered => ("delivered", "written to the recipient's running agent"),
        DeliveryStatus::Queued => (
            "queued",
            "stored in the recipient's inbox; its agent receives it when it runs",
        ),
        DeliveryStatus::Unspecified => ("unspecified", "stored in the recipient's inbox"),
    }
}

/// A created session.
pub fn created(r: &pb::CreateSessionResponse) -> Value {
    json!({
        "session": opt_session(r.session.as_ref()),
        "quota": quota(r.quota.as_ref()),
        "result": result(r.result.as_ref()),
    })
}

/// A message sent.
pub fn sent(r: &pb::SendMessageResponse) -> Value {
    let (delivery, note) = delivery(r.delivery());
    json!({
        "session_id": r.session_id,
        "message_id": r.message_id,
        "sequence": r.sequence,
        "delivery": delivery,
        "note": note,
    })
}

/// The sessions the caller may see.
pub fn listed(sessions: &[pb::Session]) -> Value {
    json!({
        "count": sessions.len(),
        "sessions": sessions.iter().map(session).collect::<Vec<_>>(),
    })
}

/// One session with its children and result.
pub fn got(r: &pb::GetSessionResponse) -> Value {
    json!({
        "session": opt_session(r.session.as_ref()),
        "result": result(r.result.as_ref()),
        "children": r.children.iter().map(session).collect::<Vec<_>>(),
        "inbox_count": r.inbox_count,
        "unread_count": r.unread_count,
    })
}

/// A termination.
pub fn terminated(r: &pb::TerminateSessionResponse) -> Value {
    json!({
        "terminated_session_ids": r.terminated_session_ids,
        "session": opt_session(r.session.as_ref()),
    })
}

/// What each recipient of a broadcast or a group post got.
pub fn fanned_out(recipients: &[pb::Recipient]) -> Value {
    let entries: Vec<Value> = recipients
        .iter()
        .map(|r| match r.outcome() {
            pb::RecipientOutcome::Delivered => {
                let (delivery, _) = delivery(r.delivery());
                json!({
                    "session_id": r.session_id,
                    "outcome": "delivered",
                    "message_id": r.message_id,
                    "sequence": r.sequence,
                    "delivery": delivery,
                })
            }
            pb::RecipientOutcome::InboxFull => json!({
                "session_id": r.session_id,
                "outcome": "inbox_full",
                "note": "its inbox holds as many unread bytes as one may: nothing stored; \
                         retry once it has read some",
            }),
            _ => json!({
                "session_id": r.session_id,
                "outcome": "ended",
                "note": "it has ended and takes no messages",
            }),
        })
        .collect();
    let delivered = recipients
        .iter()
        .filter(|r| r.outcome() == pb::RecipientOutcome::Delivered)
        .count();
    json!({
        "delivered": delivered,
        "recipients": entries,
    })
}

/// A group, with the members the caller may see.
pub fn group(g: &pb::Group) -> Value {
    json!({
        "name": g.name,
        "workspace_id": g.workspace_id,
        "member_ids": g.member_ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_uses_words_and_nulls() {
        let s = pb::Session {
            session_id: "sess_1".into(),
            status: pb::SessionStatus::Completed as i32,
            trust_level: pb::TrustLevel::Sandboxed as i32,
            exit_code: Some(0),
            ..Default::default()
        };
        let v = session(&s);
        assert_eq!(v["status"], "completed");
        assert_eq!(v["ended"], true);
        assert_eq!(v["exit_code"], 0);
        assert_eq!(v["trust_level"], "sandboxed");
        assert_eq!(v["parent_session_id"], Value::Null);
        assert_eq!(result(None), Value::Null);
    }
}
