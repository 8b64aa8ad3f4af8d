//! The process's file descriptors, shared out. At start the soft limit is
//! raised to the hard one ([`Descriptors::raise`]); a reserve is kept for
//! what is not a client's (the database's connections and files, the
//! runner's and the provider's connections, logs), and the rest is divided
//! evenly among the process's listeners ([`Descriptors::fit`]): a listener
//! configured for more than its share is given its share, and says so.
//! So a flood on one listener stops at its cap, and neither another
//! listener nor the database work runs out of descriptors.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

use crate::gate::Bounds;

/// Descriptors kept out of every listener's share by default.
pub const DEFAULT_RESERVE: u64 = 256;

/// The descriptor limit after [`Descriptors::raise`], and the reserve.
#[derive(Clone, Copy, Debug)]
pub struct Descriptors {
    /// The soft limit now in force.
    pub limit: u64,
    /// Descriptors no listener's share includes.
    pub reserve: u64,
}

impl Descriptors {
    /// Raises the soft limit on open descriptors to the hard limit (best
    /// effort: where that fails, the soft limit stays) and keeps `reserve`.
    pub fn raise(reserve: u64) -> Descriptors {
        let Rlimit { current, maximum } = getrlimit(Resource::Nofile);
        let mut limit = current.unwrap_or(u64::MAX);
        if current != maximum {
            let raised = Rlimit {
                current: maximum,
                maximum,
            };
            match setrlimit(Resource::Nofile, raised) {
                Ok(()) => limit = maximum.unwrap_or(u64::MAX),
                Err(e) => tracing::warn!(
                    error = %e,
                    limit,
                    "cannot raise the open file limit to its hard limit"
                ),
            }
        }
        Descriptors { limit, reserve }
    }

    /// Each listener's share: what the limit leaves past the reserve,
    /// divided evenly among `listeners` (at least 1 each).
    pub fn share(&self, listeners: usize) -> usize {
        let free = self.limit.saturating_sub(self.reserve);
        let share = free / listeners.max(1) as u64;
        usize::try_from(share).unwrap_or(usize::MAX).max(1)
    }

    /// Fits each listener's caps (by name) within its share, logging those
    /// cut down.
    pub fn fit(&self, listeners: &mut [(&'static str, &mut Bounds)]) {
        let share = self.share(listeners.len());
        for (name, bounds) in listeners.iter_mut() {
            if bounds.max_connections > share {
                tracing::warn!(
                    listener = *name,
                    configured = bounds.max_connections,
                    share,
                    limit = self.limit,
                    reserve = self.reserve,
                    "the open file limit leaves this listener fewer connections than configured"
                );
                bounds.max_connections = share;
            }
            bounds.max_per_peer = bounds.max_per_peer.min(bounds.max_connections);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_share_what_the_reserve_leaves() {
        let d = Descriptors {
            limit: 1200,
            reserve: 256,
        };
        let mut a = Bounds {
            max_connections: 4096,
            max_per_peer: 1000,
            ..Bounds::default()
        };
        let mut b = Bounds {
            max_connections: 100,
            max_per_peer: 10,
            ..Bounds::default()
        };
        d.fit(&mut [("a", &mut a), ("b", &mut b)]);
        assert_eq!(a.max_connections, 472);
        assert_eq!(a.max_per_peer, 472);
        assert_eq!(b.max_connections, 100, "within its share, as configured");
        assert_eq!(b.max_per_peer, 10);
    }
}
