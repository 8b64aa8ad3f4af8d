//! Which shards may have new work for the driver (`ProcessStore::driver_work`):
//! a set of shards marked by commits and taken by the driver's loop, and a
//! `watch` bumped with each mark. On PostgreSQL a commit that may make
//! work (any event but output, progress and usage: a session created,
//! started, messaged or ended) moves its shards' work counters, and every
//! replica's reader marks the shards whose counters moved
//! (`postgres::wake`), so a replica reads its work only after commits in
//! its own shards; output, the bulk of commits, wakes no one's driver. On
//! SQLite every commit marks every shard.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use tokio::sync::watch;

use crate::{model::EventKind, shard::ShardSet};

/// The shards marked since the driver last took them.
#[derive(Clone, Debug)]
pub(crate) struct WorkSignal {
    marked: Arc<AtomicU64>,
    bumped: watch::Sender<u64>,
}

impl Default for WorkSignal {
    fn default() -> Self {
        WorkSignal {
            marked: Arc::new(AtomicU64::new(0)),
            bumped: watch::channel(0).0,
        }
    }
}

impl WorkSignal {
    /// Marks `shards` and wakes the driver.
    pub(crate) fn mark(&self, shards: ShardSet) {
        self.marked.fetch_or(shards.mask() as u64, Ordering::AcqRel);
        self.bumped.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The shards marked since the last take, unmarked.
    pub(crate) fn take(&self) -> ShardSet {
        ShardSet::from_mask(self.marked.swap(0, Ordering::AcqRel))
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.bumped.subscribe()
    }
}

/// Whether an event of `kind` may leave the driver work to do.
pub(crate) fn makes_work(kind: EventKind) -> bool {
    !matches!(
        kind,
        EventKind::Output | EventKind::OutputTruncated | EventKind::Progress | EventKind::Usage
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_taken_once() {
        let signal = WorkSignal::default();
        let woken = signal.subscribe();
        let shard = |n| crate::shard::Shard::new(n).unwrap();
        signal.mark([shard(3), shard(17)].into_iter().collect());
        signal.mark(ShardSet::of(shard(5)));
        assert!(woken.has_changed().unwrap());
        let taken = signal.take();
        let got: Vec<u16> = taken.iter().map(|s| s.index()).collect();
        assert_eq!(got, [3, 5, 17]);
        assert!(signal.take().is_empty(), "taken once");
        assert!(makes_work(EventKind::Message) && !makes_work(EventKind::Output));
    }
}
