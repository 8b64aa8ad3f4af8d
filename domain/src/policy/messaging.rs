//! The rules of messages to many: who a broadcast or a group post reaches
//! ([`reach`], [`plan_fan_out`]: `may_message` for every recipient), how
//! many at once ([`plan_fan_out`], [`admit_group_size`]), the message
//! rates every message a session sends counts against, in messages and in
//! bytes ([`admit_messages`]), and what an inbox holds ([`admit_inbox`]).
//!
//! The rates count each recipient: what they bound is messages agents read
//! and pay a model to answer (and bytes the database keeps for them), and
//! counting a broadcast once would let one call do what the rate forbids a
//! hundred. So a broadcast larger than a burst is never allowed
//! (`--message-burst`, 100 by default, is above `--max-fan-out`, 64; a body
//! to 64 recipients passes the byte burst, 2 MiB, only up to 32 KiB). The
//! rates' state is a table of its own (`message_rates`), not a session
//! column, so the ledger and the session rows stay as they were.

use std::time::Duration;

use super::{can_see, may_message, trust_sees};
use crate::{
    error::{Reason, SessionError},
    limits::MessageLimits,
    model::{Caller, MessageRate, Reach, Sending, SessionId, SessionRow},
};

/// What `target` is to a message from `caller`: a recipient if `caller`
/// may message it ([`may_message`], as for `SendMessage`), reported as
/// ended if it sees it but it ended, else hidden. The caller itself is
/// never its own recipient.
pub fn reach(caller: &Caller, target: &SessionRow) -> Reach {
    if let Caller::Session(me) = caller
        && me.session_id == target.session_id
    {
        return Reach::Hidden;
    }
    match may_message(caller, target) {
        Ok(()) => Reach::Deliver,
        Err(_) if can_see(caller, target) => Reach::Ended,
        Err(_) => Reach::Hidden,
    }
}

/// What member `target` of a group is to a post from `caller`: as
/// [`reach`] says, and further hidden unless the member may message the
/// poster back. A sandboxed member never hears a direct poster in a group
/// (nor learns from the post that it is a member), though a direct session
/// may message it on its own.
pub fn reach_member(caller: &Caller, target: &SessionRow) -> Reach {
    match caller {
        Caller::Session(poster) if !trust_sees(target.trust, poster.trust) => Reach::Hidden,
        _ => reach(caller, target),
    }
}

/// Plans a message to many: each candidate once, in the order given, as
/// `reach` says ([`reach`], or [`reach_member`] for a group post; hidden
/// ones left out), refused if more than the fan-out limit would receive it.
pub fn plan_fan_out(
    caller: &Caller,
    candidates: &[SessionRow],
    limits: &MessageLimits,
    reach: fn(&Caller, &SessionRow) -> Reach,
) -> Result<Vec<(SessionId, Reach)>, SessionError> {
    let mut seen = std::collections::HashSet::new();
    let plan: Vec<(SessionId, Reach)> = candidates
        .iter()
        .filter(|row| seen.insert(row.session_id.as_str()))
        .map(|row| (row.session_id.clone(), reach(caller, row)))
        .filter(|(_, reach)| *reach != Reach::Hidden)
        .collect();
    let delivered = plan.iter().filter(|(_, r)| *r == Reach::Deliver).count();
    if delivered > limits.max_fan_out as usize {
        return Err(SessionError::refused(
            Reason::FanOutExceeded,
            format!(
                "the message would reach {delivered} sessions; one message reaches at most {}",
                limits.max_fan_out
            ),
        ));
    }
    Ok(plan)
}

/// Checks that a group would hold no more than the fan-out limit plus its
/// poster once `after` are its members, counting only the members `adder`
/// may see: a refusal tells the adder nothing it cannot list (a sandboxed
/// member learns nothing of direct members this way). A group may so hold
/// more members in all than the limit; a post to it is still bounded, by
/// [`plan_fan_out`], on the members the poster reaches.
pub fn admit_group_size(
    adder: &Caller,
    after: &[SessionRow],
    limits: &MessageLimits,
) -> Result<(), SessionError> {
    let most = limits.max_fan_out as usize + 1;
    let members = after.iter().filter(|m| can_see(adder, m)).count();
    if members > most {
        return Err(SessionError::refused(
            Reason::FanOutExceeded,
            format!("a group holds at most {most} members; this add would pass it"),
        ));
    }
    Ok(())
}

/// The message rates, as the generic cell rate algorithm: what `sending`
/// (messages, and their bytes once per recipient) at `now_ms` does to a
/// session whose rate state is `rate`. Returns the new state, or refuses
/// (RATE_LIMITED, with how long to wait) without sending any: a broadcast
/// counts each recipient, all of them or none. A rate of zero or less
/// disables that limit.
pub fn admit_messages(
    rate: MessageRate,
    sending: Sending,
    now_ms: i64,
    limits: &MessageLimits,
) -> Result<MessageRate, SessionError> {
    let messages = Cell {
        per_sec: limits.message_rate_per_sec,
        burst: f64::from(limits.message_burst.max(1)),
        unit: "messages",
    };
    let bytes = Cell {
        per_sec: limits.message_bytes_per_sec as f64,
        burst: limits.message_bytes_burst as f64,
        unit: "bytes",
    };
    Ok(MessageRate {
        messages_tat_ms: messages.admit(rate.messages_tat_ms, sending.messages as f64, now_ms)?,
        bytes_tat_ms: bytes.admit(rate.bytes_tat_ms, sending.bytes as f64, now_ms)?,
    })
}

/// One rate of [`admit_messages`]: `per_sec` units a second, `burst` above it.
struct Cell {
    per_sec: f64,
    burst: f64,
    unit: &'static str,
}

impl Cell {
    fn admit(&self, tat_ms: i64, count: f64, now_ms: i64) -> Result<i64, SessionError> {
        if count <= 0.0 || self.per_sec <= 0.0 {
            return Ok(tat_ms);
        }
        let (per_sec, burst, unit) = (self.per_sec, self.burst, self.unit);
        let rate = format!("{per_sec} {unit} per second, burst {burst}");
        if count > burst {
            return Err(SessionError::refused(
                Reason::RateLimited,
                format!("{count} {unit} at once are more than the message rate allows ({rate})"),
            ));
        }
        let ms = |units: f64| (units * 1000.0 / per_sec).ceil() as i64;
        let tat = tat_ms.max(now_ms).saturating_add(ms(count));
        let allowed = now_ms.saturating_add(ms(burst));
        if tat <= allowed {
            return Ok(tat);
        }
        let wait = Duration::from_millis((tat - allowed) as u64);
        Err(SessionError::Refused {
            reason: Reason::RateLimited,
            message: format!(
                "message rate exceeded ({rate}): retry in {} ms",
                wait.as_millis()
            ),
            quota: None,
            retry_after: Some(wait),
        })
    }
}

/// Whether an inbox holding `unread` bytes not yet delivered takes a
/// message of `bytes` more: refused (INBOX_FULL) past the limit. The answer
/// names the limit, not what the inbox holds.
pub fn admit_inbox(unread: u64, bytes: u64, limits: &MessageLimits) -> Result<(), SessionError> {
    if unread.saturating_add(bytes) <= limits.max_unread_bytes {
        return Ok(());
    }
    Err(SessionError::refused(
        Reason::InboxFull,
        format!(
            "the recipient's inbox is full: it holds at most {} bytes of messages not yet \
             delivered; retry once it has read some",
            limits.max_unread_bytes
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(rate: f64, burst: u32) -> MessageLimits {
        MessageLimits {
            message_rate_per_sec: rate,
            message_burst: burst,
            message_bytes_per_sec: 0,
            ..MessageLimits::default()
        }
    }

    fn at(messages_tat_ms: i64) -> MessageRate {
        MessageRate {
            messages_tat_ms,
            bytes_tat_ms: 0,
        }
    }

    fn messages(n: usize) -> Sending {
        Sending {
            messages: n,
            bytes: n as u64,
        }
    }

    #[test]
    fn messages_fill_the_burst_then_wait_per_message() {
        let l = limits(10.0, 5);
        let rate = admit_messages(at(0), messages(5), 1_000, &l).expect("a full burst at once");
        assert_eq!(rate.messages_tat_ms, 1_500);
        let refused = admit_messages(rate, messages(1), 1_000, &l).expect_err("past the burst");
        assert_eq!(refused.reason(), Reason::RateLimited);
        assert!(
            admit_messages(rate, messages(1), 1_100, &l).is_ok(),
            "one interval later"
        );
    }

    #[test]
    fn more_at_once_than_the_burst_is_refused_and_zero_rate_is_unlimited() {
        assert!(admit_messages(at(0), messages(6), 1_000, &limits(10.0, 5)).is_err());
        let unlimited = admit_messages(at(7), messages(1_000), 1_000, &limits(0.0, 1));
        assert_eq!(unlimited.unwrap().messages_tat_ms, 7);
    }

    #[test]
    fn bytes_count_once_per_recipient_against_their_own_rate() {
        let l = MessageLimits {
            message_rate_per_sec: 0.0,
            message_bytes_per_sec: 1_000,
            message_bytes_burst: 10_000,
            ..MessageLimits::default()
        };
        let body = "x".repeat(2_500);
        let four = admit_messages(MessageRate::default(), Sending::to_each(4, &body), 0, &l)
            .expect("10,000 bytes: the whole burst");
        assert_eq!(four.bytes_tat_ms, 10_000);
        let more = admit_messages(four, Sending::to_each(1, &body), 0, &l);
        assert_eq!(more.expect_err("past it").reason(), Reason::RateLimited);
        let five = admit_messages(MessageRate::default(), Sending::to_each(5, &body), 0, &l);
        assert_eq!(
            five.expect_err("more than a burst at once").reason(),
            Reason::RateLimited
        );
        assert!(
            admit_messages(four, Sending::to_each(1, &body), 2_500, &l).is_ok(),
            "2.5 s later, room for 2,500 bytes"
        );
    }

    #[test]
    fn an_inbox_takes_messages_up_to_its_limit_and_says_only_the_limit() {
        let l = MessageLimits {
            max_unread_bytes: 1_000,
            ..MessageLimits::default()
        };
        assert!(admit_inbox(600, 400, &l).is_ok());
        let full = admit_inbox(600, 401, &l).expect_err("one byte past");
        assert_eq!(full.reason(), Reason::InboxFull);
        assert!(!full.to_string().contains("600"), "{full}");
        assert!(admit_inbox(u64::MAX, 1, &l).is_err());
    }
}
