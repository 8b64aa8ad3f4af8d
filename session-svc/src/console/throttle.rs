//! Throttling failed sign-ins: each client address may fail
//! `--console-sign-in-failures-per-minute` times at once, then once per
//! share of a minute; all clients together
//! `--console-sign-in-global-failures-per-minute`. Past either, a sign-in is
//! refused (429, `Retry-After`) before its token is looked at, so guessing
//! goes no faster than the bound, and one client's failures never stop
//! another's sign-in (unless the global bound, a flood's, is reached).
//!
//! Each bound is a GCRA (a leaky bucket kept as one instant, its
//! "theoretical arrival time"): an attempt is charged when it is admitted,
//! so concurrent attempts cannot all pass, and the charge is given back
//! when its token was right. The state is this process's own: each replica
//! counts the failures it saw.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::Mutex,
    time::{Duration, Instant},
};

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
}

/// An admitted attempt, charged until [`SignInThrottle::succeeded`] gives
/// it back.
#[must_use]
pub struct Admitted {
    client: IpAddr,
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
            }),
        }
    }

    /// Admits a sign-in attempt of `client` and charges it as a failure, or
    /// says how long the client must wait.
    pub fn admit(&self, client: IpAddr) -> Result<Admitted, Duration> {
        self.admit_at(client, Instant::now())
    }

    fn admit_at(&self, client: IpAddr, now: Instant) -> Result<Admitted, Duration> {
        let client = key(client);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // Buckets drained to now hold nothing: forget them (the global
        // bound keeps the map small between two prunes).
        if state.clients.len() >= 1024 {
            state.clients.retain(|_, tat| *tat > now);
        }
        let mut tat = state.clients.get(&client).copied().unwrap_or(now);
        self.per_client.charge(&mut tat, now)?;
        let mut global = state.global;
        self.global.charge(&mut global, now)?;
        state.global = global;
        state.clients.insert(client, tat);
        Ok(Admitted { client })
    }

    /// The attempt's token was right: its charge is given back.
    pub fn succeeded(&self, admitted: Admitted) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let global = self.global;
        global.refund(&mut state.global);
        if let Some(tat) = state.clients.get_mut(&admitted.client) {
            self.per_client.refund(tat);
        }
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
    fn right_tokens_cost_nothing_and_the_global_bound_holds_everyone() {
        let throttle = SignInThrottle::new(2, 3);
        let now = Instant::now();
        for _ in 0..10 {
            let ok = throttle.admit_at(ip("10.0.0.1"), now).expect("admitted");
            throttle.succeeded(ok);
        }
        for client in ["10.0.0.2", "10.0.0.3", "10.0.0.4"] {
            let _failed = throttle.admit_at(ip(client), now).expect(client);
        }
        assert!(throttle.admit_at(ip("10.0.0.5"), now).is_err(), "a flood");
    }

    #[test]
    fn ipv6_clients_count_by_their_64_and_mapped_ones_as_ipv4() {
        assert_eq!(key(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(key(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
        assert_eq!(key(ip("10.0.0.1")), ip("10.0.0.1"));
    }
}
