//! Throttling failed sign-ins. Each client address (an IPv6 client's /64,
//! an IPv4-mapped one as IPv4) may fail
//! `--console-sign-in-failures-per-minute` times at once, then once per
//! share of a minute: past that, its sign-ins are refused (429,
//! `Retry-After`) before their token is looked at, so guessing from one
//! address goes no faster than the bound, and one client's failures never
//! stop another's sign-in.
//!
//! All clients together may fail `--console-sign-in-global-failures-per-minute`
//! times: that bound is on what failures cost, not on who signs in. A
//! sign-in its client's bound admits is always compared (in constant time,
//! which costs next to nothing), so the operator's right token gets through
//! while a flood of wrong ones from many addresses runs; only the failures
//! within the global bound are audited one by one, and those past it are
//! refused 429 and counted in a log line at most every
//! [`REPORT_EVERY`]. Guessing stays bounded by each address's bound: an
//! attacker guesses as fast as it has addresses, against a token of at
//! least 16 bytes (32 random bytes when generated).
//!
//! Each bound is a GCRA (a leaky bucket kept as one instant, its
//! "theoretical arrival time"). A client's attempt is charged when it is
//! admitted, so concurrent attempts cannot all pass, and given back when
//! its token was right; the global bucket is charged by failures alone.
//! At most [`MAX_CLIENTS`] addresses are followed at once (their buckets
//! drain within a minute): past that, a new address's attempts are
//! compared unthrottled until there is room, and its failures go to the
//! global bound only. The state is this process's own: each replica counts
//! the failures it saw.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::Mutex,
    time::{Duration, Instant},
};

/// Client addresses followed at once (a few MiB at most).
pub const MAX_CLIENTS: usize = 65_536;
/// How often at most the refusals of the throttle are logged (as a count).
pub const REPORT_EVERY: Duration = Duration::from_secs(10);

/// One bound: `burst` failures at once, then one per `interval`.
#[derive(Clone, Copy, Debug)]
struct Rate {
    interval: Duration,
    burst: u32,
}

impl Rate {
    fn per_minute(n: u32) -> Rate {
        let n = n.max(1);
        Rate {
            interval: Duration::from_secs(60) / n,
            burst: n,
        }
    }

    /// How far ahead of now the arrival time may run.
    fn tolerance(self) -> Duration {
        self.interval * (self.burst - 1)
    }

    /// Charges one failure to `tat` (the bucket's arrival time), unless it
    /// is full: then how long until it may take one.
    fn charge(self, tat: &mut Instant, now: Instant) -> Result<(), Duration> {
        let start = (*tat).max(now);
        let allowed_at = start.checked_sub(self.tolerance()).unwrap_or(now);
        if allowed_at > now {
            return Err(allowed_at - now);
        }
        *tat = start + self.interval;
        Ok(())
    }

    /// Gives a charge back (the attempt did not fail).
    fn refund(self, tat: &mut Instant) {
        *tat = tat.checked_sub(self.interval).unwrap_or(*tat);
    }
}

/// The failed sign-ins of the console's clients.
#[derive(Debug)]
pub struct SignInThrottle {
    per_client: Rate,
    global: Rate,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    global: Instant,
    clients: HashMap<IpAddr, Instant>,
    /// When drained buckets were last forgotten.
    pruned: Instant,
    /// Refusals not logged yet, and when they last were.
    unreported: u64,
    reported: Option<Instant>,
}

/// An admitted attempt, charged to its client (if followed) until
/// [`SignInThrottle::succeeded`] gives it back.
#[must_use]
pub struct Admitted {
    client: Option<IpAddr>,
}

/// What a failed attempt was, once charged to the global bound.
#[derive(Debug, PartialEq, Eq)]
pub enum Failure {
    /// Within the global bound: audited.
    Counted,
    /// Past it (a flood): refused 429 without an audit entry, and how long
    /// until the bound takes failures again.
    Flood(Duration),
}

impl SignInThrottle {
    pub fn new(per_client_per_minute: u32, global_per_minute: u32) -> SignInThrottle {
        let now = Instant::now();
        SignInThrottle {
            per_client: Rate::per_minute(per_client_per_minute),
            global: Rate::per_minute(global_per_minute),
            state: Mutex::new(State {
                global: now,
                clients: HashMap::new(),
                pruned: now,
                unreported: 0,
                reported: None,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a sign-in attempt of `client`, charged to it as a failure,
    /// or says how long the client must wait (its own failures only).
    pub fn admit(&self, client: IpAddr) -> Result<Admitted, Duration> {
        self.admit_at(client, Instant::now())
    }

    fn admit_at(&self, client: IpAddr, now: Instant) -> Result<Admitted, Duration> {
        let client = key(client);
        let mut state = self.state();
        // Buckets drained to now hold nothing: forget them, at most once a
        // second (a full map of live buckets is not walked per request).
        if state.clients.len() >= MAX_CLIENTS && now >= state.pruned + Duration::from_secs(1) {
            state.clients.retain(|_, tat| *tat > now);
            state.pruned = now;
        }
        let followed = state.clients.contains_key(&client);
        if !followed && state.clients.len() >= MAX_CLIENTS {
            return Ok(Admitted { client: None });
        }
        let tat = state.clients.entry(client).or_insert(now);
        self.per_client.charge(tat, now)?;
        Ok(Admitted {
            client: Some(client),
        })
    }

    /// The attempt's token was right: its charge is given back.
    pub fn succeeded(&self, admitted: Admitted) {
        let mut state = self.state();
        if let Some(tat) = admitted.client.and_then(|c| state.clients.get_mut(&c)) {
            self.per_client.refund(tat);
        }
    }

    /// The attempt's token was wrong: charges the global bound.
    pub fn failed(&self, admitted: Admitted) -> Failure {
        self.failed_at(admitted, Instant::now())
    }

    fn failed_at(&self, _admitted: Admitted, now: Instant) -> Failure {
        let mut state = self.state();
        match self.global.charge(&mut state.global, now) {
            Ok(()) => Failure::Counted,
            Err(wait) => Failure::Flood(wait),
        }
    }

    /// Counts a refusal (429); every [`REPORT_EVERY`] at most, how many
    /// there were since the last report, for one log line.
    pub fn refused(&self) -> Option<u64> {
        self.refused_at(Instant::now())
    }

    fn refused_at(&self, now: Instant) -> Option<u64> {
        let mut state = self.state();
        state.unreported += 1;
        let due = state
            .reported
            .is_none_or(|at| now.saturating_duration_since(at) >= REPORT_EVERY);
        if !due {
            return None;
        }
        state.reported = Some(now);
        Some(std::mem::take(&mut state.unreported))
    }
}

/// The address a client is counted under: an IPv6 client's /64 (one
/// host's share, as providers hand them out), an IPv4-mapped one as IPv4.
fn key(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(_) => addr,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let segments = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(
                    segments[0],
                    segments[1],
                    segments[2],
                    segments[3],
                    0,
                    0,
                    0,
                    0,
                ))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_client_fails_its_burst_then_one_per_interval() {
        let throttle = SignInThrottle::new(5, 1000);
        let now = Instant::now();
        for _ in 0..5 {
            let _failed = throttle.admit_at(ip("10.0.0.1"), now).expect("admitted");
        }
        let wait = throttle
            .admit_at(ip("10.0.0.1"), now)
            .err()
            .expect("the sixth waits");
        assert_eq!(wait, Duration::from_secs(12));
        // Another client is not held back by the first one's failures.
        let other = throttle.admit_at(ip("10.0.0.2"), now).expect("another");
        throttle.succeeded(other);
        let later = now + Duration::from_secs(12);
        let _again = throttle.admit_at(ip("10.0.0.1"), later).expect("one more");
        assert!(throttle.admit_at(ip("10.0.0.1"), later).is_err());
    }

    #[test]
    fn right_tokens_cost_nothing_and_a_flood_holds_back_failures_not_the_operator() {
        let throttle = SignInThrottle::new(2, 3);
        let now = Instant::now();
        for _ in 0..10 {
            let ok = throttle.admit_at(ip("10.0.0.1"), now).expect("admitted");
            throttle.succeeded(ok);
        }
        for client in ["10.0.0.2", "10.0.0.3", "10.0.0.4"] {
            let failed = throttle.admit_at(ip(client), now).expect(client);
            assert_eq!(throttle.failed_at(failed, now), Failure::Counted);
        }
        // Past the global bound a failure is a flood's (not audited)...
        let flood = throttle.admit_at(ip("10.0.0.5"), now).expect("compared");
        assert_eq!(
            throttle.failed_at(flood, now),
            Failure::Flood(Duration::from_secs(20))
        );
        // ...and the operator's attempt is still admitted and compared.
        let operator = throttle.admit_at(ip("10.0.0.6"), now).expect("admitted");
        throttle.succeeded(operator);
        // Each address keeps its own bound through the flood.
        let _one = throttle.admit_at(ip("10.0.0.5"), now).expect("its second");
        assert!(throttle.admit_at(ip("10.0.0.5"), now).is_err(), "its third");
    }

    #[test]
    fn past_the_followed_addresses_new_ones_are_compared_unthrottled() {
        let throttle = SignInThrottle::new(1, 1);
        let now = Instant::now();
        for n in 0..MAX_CLIENTS as u32 {
            let client = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + n));
            let _failed = throttle.admit_at(client, now).expect("admitted");
        }
        let late = throttle.admit_at(ip("11.0.0.1"), now).expect("compared");
        assert!(late.client.is_none(), "not followed");
        // A minute on, the drained buckets are forgotten and it is followed.
        let later = now + Duration::from_secs(61);
        let followed = throttle.admit_at(ip("11.0.0.1"), later).expect("admitted");
        assert!(followed.client.is_some());
        assert_eq!(throttle.state().clients.len(), 1);
    }

    #[test]
    fn refusals_are_reported_as_a_count_at_most_every_ten_seconds() {
        let throttle = SignInThrottle::new(1, 1);
        let now = Instant::now();
        assert_eq!(throttle.refused_at(now), Some(1));
        for _ in 0..99 {
            assert_eq!(throttle.refused_at(now + Duration::from_secs(1)), None);
        }
        assert_eq!(throttle.refused_at(now + REPORT_EVERY), Some(100));
    }

    #[test]
    fn ipv6_clients_count_by_their_64_and_mapped_ones_as_ipv4() {
        assert_eq!(key(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(key(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
        assert_eq!(key(ip("10.0.0.1")), ip("10.0.0.1"));
    }
}
