//! Which shards' events moved: a counter per shard, bumped after commits,
//! that watchers wait on for the shards they watch alone. A watcher of one
//! workspace is not woken by the commits of another shard's; one of every
//! workspace is woken by all.
//!
//! SQLite bumps every shard on each commit. PostgreSQL bumps the shards
//! whose `event_shards` rows moved (`postgres::wake`), for commits here and
//! on other replicas alike.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use tokio::sync::watch;

use crate::shard::{SHARDS, ShardSet};

/// The shards' change counters, shared by a store's clones.
#[derive(Clone, Debug)]
pub(crate) struct Changes {
    counts: Arc<[AtomicU64; SHARDS as usize]>,
    bumped: watch::Sender<u64>,
}

impl Default for Changes {
    fn default() -> Self {
        Changes {
            counts: Arc::new(std::array::from_fn(|_| AtomicU64::new(0))),
            bumped: watch::channel(0).0,
        }
    }
}

impl Changes {
    /// Records a change in `shards` and wakes their watchers.
    pub(crate) fn mark(&self, shards: ShardSet) {
        if shards.is_empty() {
            return;
        }
        for shard in shards.iter() {
            self.counts[usize::from(shard.index())].fetch_add(1, Ordering::AcqRel);
        }
        self.bumped.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A watch of `shards`' changes, from now on.
    pub(crate) fn watch(&self, shards: ShardSet) -> ChangeWatch {
        let mut watch = ChangeWatch {
            counts: self.counts.clone(),
            bumped: self.bumped.subscribe(),
            shards,
            seen: 0,
        };
        watch.borrow_and_update();
        watch
    }
}

/// Waits for changes in some shards (`LogStore::subscribe`).
#[derive(Debug)]
pub struct ChangeWatch {
    counts: Arc<[AtomicU64; SHARDS as usize]>,
    bumped: watch::Receiver<u64>,
    shards: ShardSet,
    /// The sum of the shards' counters when last marked seen: counters
    /// only grow, so the sum moves with any of them.
    seen: u64,
}

impl ChangeWatch {
    fn sum(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| self.counts[usize::from(s.index())].load(Ordering::Acquire))
            .fold(0, u64::wrapping_add)
    }

    /// Marks every change so far as seen: call it before reading, so that a
    /// commit during the read wakes the next [`ChangeWatch::changed`].
    pub fn borrow_and_update(&mut self) {
        self.bumped.borrow_and_update();
        self.seen = self.sum();
    }

    /// Waits for a change in the watched shards since the last
    /// [`ChangeWatch::borrow_and_update`] or the last return of this (which
    /// marks what it saw as seen, as `watch::Receiver::changed` does); fails
    /// once the store is gone.
    pub async fn changed(&mut self) -> Result<(), watch::error::RecvError> {
        loop {
            let now = self.sum();
            if now != self.seen {
                self.seen = now;
                return Ok(());
            }
            self.bumped.changed().await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::shard::Shard;

    #[tokio::test]
    async fn a_watch_wakes_for_its_own_shards_alone() {
        let changes = Changes::default();
        let three = Shard::new(3).unwrap();
        let mut watch = changes.watch(ShardSet::of(three));
        changes.mark(ShardSet::of(Shard::new(4).unwrap()));
        let quiet = tokio::time::timeout(Duration::from_millis(50), watch.changed()).await;
        assert!(quiet.is_err(), "woken by another shard");
        changes.mark(ShardSet::of(three));
        watch.changed().await.unwrap();
        let quiet = tokio::time::timeout(Duration::from_millis(50), watch.changed()).await;
        assert!(quiet.is_err(), "woken again for a change it returned for");
        changes.mark(ShardSet::of(three));
        watch.borrow_and_update();
        let quiet = tokio::time::timeout(Duration::from_millis(50), watch.changed()).await;
        assert!(quiet.is_err(), "woken again for a change seen");
        let mut all = changes.watch(ShardSet::ALL);
        changes.mark(ShardSet::of(Shard::new(63).unwrap()));
        all.changed().await.unwrap();
    }
}
