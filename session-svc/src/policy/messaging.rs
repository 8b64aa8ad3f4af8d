//! The rules of messages to many: who a broadcast or a group post reaches
//! ([`reach`], [`plan_fan_out`]: `may_message` for every recipient), how
//! many at once ([`plan_fan_out`], [`admit_group_size`]), and the message
//! rate every message a session sends counts against ([`admit_messages`]).
//!
//! The rate counts each recipient: what it bounds is messages agents read
//! and pay a model to answer, and counting a broadcast once would let one
//! call do what the rate forbids a hundred. So a broadcast larger than the
//! burst is never allowed (`--message-burst`, 100 by default, is above
//! `--max-fan-out`, 64). The rate's state is a table of its own
//! (`message_rates`), not a session column, so the ledger and the session
//! rows stay as they were.

use std::time::Duration;

use super::{can_see, may_message, trust_sees};
use crate::{
    config::MessageLimits,
    error::{Reason, SessionError},
    model::{Caller, Reach, SessionRow},
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
) -> Result<Vec<(String, Reach)>, SessionError> {
    let mut seen = std::collections::HashSet::new();
    let plan: Vec<(String, Reach)> = candidates
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

/// The message rate, as the generic cell rate algorithm: `count` messages
/// sent at `now_ms` by a session whose rate state is `tat_ms`. Returns the
/// new state, or refuses (RATE_LIMITED, with how long to wait) without
/// sending any: a broadcast counts each recipient, all of them or none. A
/// rate of zero or less disables the limit.
pub fn admit_messages(
    tat_ms: i64,
    count: usize,
    now_ms: i64,
    limits: &MessageLimits,
) -> Result<i64, SessionError> {
    if count == 0 || limits.message_rate_per_sec <= 0.0 {
        return Ok(tat_ms);
    }
    let burst = limits.message_burst.max(1);
    let rate = format!("{} per second, burst {burst}", limits.message_rate_per_sec);
    if count > burst as usize {
        return Err(SessionError::refused(
            Reason::RateLimited,
            format!("{count} messages at once are more than the message rate allows ({rate})"),
        ));
    }
    let interval = (1000.0 / limits.message_rate_per_sec).ceil() as i64;
    let count = count as i64;
    let tat = tat_ms
        .max(now_ms)
        .saturating_add(interval.saturating_mul(count));
    let allowed = now_ms.saturating_add(interval.saturating_mul(i64::from(burst)));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(rate: f64, burst: u32) -> MessageLimits {
        MessageLimits {
            message_rate_per_sec: rate,
            message_burst: burst,
            max_fan_out: 64,
        }
    }

    #[test]
    fn messages_fill_the_burst_then_wait_per_message() {
        let l = limits(10.0, 5);
        let tat = admit_messages(0, 5, 1_000, &l).expect("a full burst at once");
        assert_eq!(tat, 1_500);
        let refused = admit_messages(tat, 1, 1_000, &l).expect_err("past the burst");
        assert_eq!(refused.reason(), Reason::RateLimited);
        assert!(
            admit_messages(tat, 1, 1_100, &l).is_ok(),
            "one interval later"
        );
    }

    #[test]
    fn more_at_once_than_the_burst_is_refused_and_zero_rate_is_unlimited() {
        assert!(admit_messages(0, 6, 1_000, &limits(10.0, 5)).is_err());
        assert_eq!(admit_messages(7, 1_000, 1_000, &limits(0.0, 1)).unwrap(), 7);
    }
}
