//! Which shards may have new work for the driver (`ProcessStore::driver_work`):
//! a set of shards marked by commits and taken by the driver's loop, and a
//! `watch` bumped with each mark. On PostgreSQL a commit that may make
//! work (any event but output, progress and usage: a session created,
//! started, messaged or ended) notifies `troupe_work` with its sessions'
//! shards, and every replica's listener marks them, so a replica reads its
//! work only after commits in its own shards; output, the bulk of commits,
//! wakes no one's driver. On SQLite every commit marks every shard.

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

/// The shards a `troupe_work` notification names (`3,17`); every shard if
/// it names none it can read.
pub(crate) fn parse_shards(payload: &str) -> ShardSet {
    let shards: Option<ShardSet> = payload
        .split(',')
        .map(|s| {
            s.trim()
                .parse::<u16>()
                .ok()
                .and_then(crate::shard::Shard::new)
        })
        .collect();
    match shards {
        Some(set) if !set.is_empty() => set,
        _ => ShardSet::ALL,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_taken_once_and_a_payload_read_whole_or_as_every_shard() {
        let signal = WorkSignal::default();
        let woken = signal.subscribe();
        signal.mark(parse_shards("3,17"));
        signal.mark(parse_shards("5"));
        assert!(woken.has_changed().unwrap());
        let taken = signal.take();
        let got: Vec<u16> = taken.iter().map(|s| s.index()).collect();
        assert_eq!(got, [3, 5, 17]);
        assert!(signal.take().is_empty(), "taken once");
        assert_eq!(parse_shards(""), ShardSet::ALL);
        assert_eq!(parse_shards("3,x"), ShardSet::ALL);
        assert_eq!(parse_shards("64"), ShardSet::ALL);
        assert!(makes_work(EventKind::Message) && !makes_work(EventKind::Output));
    }
}
