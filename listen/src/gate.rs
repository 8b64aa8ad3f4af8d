//! A listener's caps: connections open in all and per peer. A connection
//! past either is closed as soon as it is accepted, before a byte of it is
//! read; the refusal is counted (`troupe_listener_refused_total`, by
//! listener and cap) and logged, at most once per [`WARN_EVERY`] per
//! listener with how many were refused meanwhile.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use opentelemetry::{
    KeyValue,
    metrics::{Counter, UpDownCounter},
};

/// Least time between two warnings of one listener about the same trouble.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// What one listener allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Connections open at once, in all.
    pub max_connections: usize,
    /// Connections open at once from one peer.
    pub max_per_peer: usize,
    /// A connection on which no byte moved either way for this long is closed.
    pub idle: Duration,
    /// Longest time to receive an HTTP/1 request's head (servers of
    /// [`crate::http`]; tonic's servers use hyper's 30 s).
    pub header: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            max_connections: 1024,
            max_per_peer: 128,
            idle: Duration::from_secs(300),
            header: Duration::from_secs(10),
        }
    }
}

/// Who a connection comes from, for the per-peer cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    /// A TCP client's address (its port aside).
    Ip(IpAddr),
    /// A Unix socket client's uid: on the agents' socket, one agent.
    Uid(u32),
    /// A Unix socket client whose credentials could not be read.
    Unknown,
}

/// Why a connection was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The listener holds its most connections.
    Total,
    /// The peer holds its most connections.
    Peer,
}

impl Refusal {
    fn as_str(self) -> &'static str {
        match self {
            Refusal::Total => "total",
            Refusal::Peer => "peer",
        }
    }
}

/// A listener's caps and what it holds; cheap to clone.
#[derive(Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

struct Inner {
    name: &'static str,
    bounds: Bounds,
    state: Mutex<State>,
    open: UpDownCounter<i64>,
    refused: Counter<u64>,
    accept_failed: Counter<u64>,
    timed_out: Counter<u64>,
}

#[derive(Default)]
struct State {
    total: usize,
    by_peer: HashMap<Peer, usize>,
    /// Refusals since the last warning, and when that was.
    unwarned: u64,
    warned: Option<Instant>,
    accept_warned: Option<Instant>,
}

impl Gate {
    /// A gate named `name` (the `listener` attribute of its metrics).
    pub fn new(name: &'static str, bounds: Bounds) -> Gate {
        let meter = opentelemetry::global::meter("troupe");
        Gate {
            inner: Arc::new(Inner {
                name,
                bounds,
                state: Mutex::new(State::default()),
                open: meter
                    .i64_up_down_counter("troupe.listener.connections")
                    .with_description("Connections a listener holds open")
                    .build(),
                refused: meter
                    .u64_counter("troupe.listener.refused")
                    .with_description(
                        "Connections a listener closed unread: its cap in all or per peer was reached",
                    )
                    .build(),
                accept_failed: meter
                    .u64_counter("troupe.listener.accept_errors")
                    .with_description(
                        "Accepts that failed (out of file descriptors, above all); the listener backs off",
                    )
                    .build(),
                timed_out: meter
                    .u64_counter("troupe.listener.timeouts")
                    .with_description("Connections closed because no byte moved for the idle time")
                    .build(),
            }),
        }
    }

    pub fn name(&self) -> &'static str {
        self.inner.name
    }

    pub fn bounds(&self) -> Bounds {
        self.inner.bounds
    }

    /// Connections open now, in all.
    pub fn open(&self) -> usize {
        self.lock().total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn attr(&self) -> [KeyValue; 1] {
        [KeyValue::new("troupe_listener", self.inner.name)]
    }

    /// A permit for a connection from `peer`, or why there is none.
    pub fn admit(&self, peer: Peer) -> Result<Permit, Refusal> {
        let bounds = self.inner.bounds;
        let mut state = self.lock();
        let of_peer = state.by_peer.get(&peer).copied().unwrap_or(0);
        let refusal = if state.total >= bounds.max_connections {
            Some(Refusal::Total)
        } else if of_peer >= bounds.max_per_peer {
            Some(Refusal::Peer)
        } else {
            None
        };
        if let Some(refusal) = refusal {
            state.unwarned += 1;
            let due = state.warned.is_none_or(|at| at.elapsed() >= WARN_EVERY);
            if due {
                tracing::warn!(
                    listener = self.inner.name,
                    cap = refusal.as_str(),
                    refused = state.unwarned,
                    open = state.total,
                    max_connections = bounds.max_connections,
                    max_per_peer = bounds.max_per_peer,
                    "connections refused: the listener is at its cap"
                );
                state.warned = Some(Instant::now());
                state.unwarned = 0;
            }
            drop(state);
            self.inner.refused.add(
                1,
                &[
                    KeyValue::new("troupe_listener", self.inner.name),
                    KeyValue::new("troupe_listener_cap", refusal.as_str()),
                ],
            );
            return Err(refusal);
        }
        state.total += 1;
        *state.by_peer.entry(peer).or_insert(0) += 1;
        drop(state);
        self.inner.open.add(1, &self.attr());
        Ok(Permit {
            gate: self.clone(),
            peer,
        })
    }

    /// Counts and (at most every [`WARN_EVERY`]) logs a failed accept.
    pub(crate) fn accept_failed(&self, error: &std::io::Error) {
        self.inner.accept_failed.add(1, &self.attr());
        let mut state = self.lock();
        if state
            .accept_warned
            .is_none_or(|at| at.elapsed() >= WARN_EVERY)
        {
            state.accept_warned = Some(Instant::now());
            drop(state);
            let short = matches!(error.raw_os_error(), Some(24 | 23)); // EMFILE, ENFILE
            tracing::error!(
                listener = self.inner.name,
                error = %error,
                out_of_descriptors = short,
                "accept failed; backing off"
            );
        }
    }

    pub(crate) fn timed_out(&self) {
        self.inner.timed_out.add(1, &self.attr());
    }

    fn release(&self, peer: Peer) {
        let mut state = self.lock();
        state.total = state.total.saturating_sub(1);
        if let Some(n) = state.by_peer.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                state.by_peer.remove(&peer);
            }
        }
        drop(state);
        self.inner.open.add(-1, &self.attr());
    }
}

/// One admitted connection's place; given back when dropped.
pub struct Permit {
    gate: Gate,
    peer: Peer,
}

impl Permit {
    pub fn gate(&self) -> &Gate {
        &self.gate
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gate.release(self.peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(total: usize, per_peer: usize) -> Gate {
        Gate::new(
            "test",
            Bounds {
                max_connections: total,
                max_per_peer: per_peer,
                ..Bounds::default()
            },
        )
    }

    #[test]
    fn caps_hold_in_all_and_per_peer_and_free_with_their_permits() {
        let g = gate(3, 2);
        let a = Peer::Uid(1);
        let b = Peer::Uid(2);
        let a1 = g.admit(a).unwrap();
        let _a2 = g.admit(a).unwrap();
        assert_eq!(g.admit(a).err(), Some(Refusal::Peer));
        let _b1 = g.admit(b).unwrap();
        assert_eq!(g.admit(b).err(), Some(Refusal::Total));
        assert_eq!(g.open(), 3);
        drop(a1);
        assert_eq!(g.open(), 2);
        assert!(g.admit(b).is_ok(), "a freed place is anyone's");
    }
}
