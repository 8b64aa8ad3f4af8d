//! Shards: how the background work divides among replicas. Every workspace
//! belongs to one of [`SHARDS`] shards, by a hash of its id that never
//! changes, and each shard has a lease of its own (its owner, its fencing
//! epoch): a workspace's agents are driven, its callbacks sent and its
//! wall-clock budgets kept by its shard's owner alone. Many more shards
//! than replicas let the work divide evenly (see `service::owner`).

use std::fmt;

/// How many shards there are: fixed, as a session's shard is stored.
pub const SHARDS: u16 = 64;

/// One shard, `0..SHARDS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shard(u16);

impl Shard {
    /// The shard fleet-wide upkeep runs with (pruning, export, the
    /// embedded runner's record): its owner does it for all.
    pub const FLEET: Shard = Shard(0);

    /// The shard of a workspace: FNV-1a of its id, modulo [`SHARDS`]. Stable
    /// across versions and processes (stored with every session).
    pub fn of(workspace_id: &str) -> Shard {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in workspace_id.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        Shard((hash % u64::from(SHARDS)) as u16)
    }

    /// Shard `n`, if there is one.
    pub fn new(n: u16) -> Option<Shard> {
        (n < SHARDS).then_some(Shard(n))
    }

    /// Every shard, in order.
    pub fn all() -> impl Iterator<Item = Shard> {
        (0..SHARDS).map(Shard)
    }

    pub fn index(self) -> u16 {
        self.0
    }

    /// The name of its lease row.
    pub fn lease_name(self) -> String {
        format!("shard:{}", self.0)
    }

    /// The shard a lease row's name names.
    pub fn from_lease_name(name: &str) -> Option<Shard> {
        name.strip_prefix("shard:")?
            .parse()
            .ok()
            .and_then(Shard::new)
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A set of shards, as one 64-bit mask (bit `n` for shard `n`): the form a
/// query takes it in (`(mask >> shard) & 1`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardSet(u64);

impl ShardSet {
    pub const ALL: ShardSet = ShardSet(u64::MAX);

    /// The set of one shard.
    pub fn of(shard: Shard) -> ShardSet {
        ShardSet(1 << shard.0)
    }

    pub fn insert(&mut self, shard: Shard) {
        self.0 |= 1 << shard.0;
    }

    pub fn contains(self, shard: Shard) -> bool {
        self.0 & (1 << shard.0) != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// The mask as a query binds it (bit 63 makes it negative; a shift
    /// and `& 1` read it alike on both backends).
    pub fn mask(self) -> i64 {
        self.0 as i64
    }

    /// The set a mask holds (bit `n` for shard `n`).
    pub fn from_mask(mask: u64) -> ShardSet {
        ShardSet(mask)
    }

    pub fn iter(self) -> impl Iterator<Item = Shard> {
        Shard::all().filter(move |s| self.contains(*s))
    }
}

impl FromIterator<Shard> for ShardSet {
    fn from_iter<I: IntoIterator<Item = Shard>>(iter: I) -> Self {
        let mut set = ShardSet::default();
        for shard in iter {
            set.insert(shard);
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_keeps_its_shard_and_workspaces_spread() {
        // Fixed values: a change of the hash would move stored sessions.
        assert_eq!(Shard::of("default"), Shard(62));
        assert_eq!(Shard::of(""), Shard(37));
        assert_eq!(Shard::of("ws-a"), Shard(21));
        // scripts/compose-check-scale kills the holder of the demo's shard.
        assert_eq!(Shard::of("demo"), Shard(22));
        let mut counts = [0u32; SHARDS as usize];
        for i in 0..6400 {
            counts[Shard::of(&format!("ws-{i}")).index() as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (50..=150).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn a_set_reads_back_what_it_holds_through_its_mask() {
        let set: ShardSet = [0, 5, 63].into_iter().filter_map(Shard::new).collect();
        assert_eq!(set.len(), 3);
        assert!(set.contains(Shard(63)) && !set.contains(Shard(1)));
        let mask = set.mask();
        let back: Vec<u16> = (0..SHARDS).filter(|n| (mask >> n) & 1 == 1).collect();
        assert_eq!(back, vec![0, 5, 63]);
        assert_eq!(
            Shard::from_lease_name(&Shard(7).lease_name()),
            Some(Shard(7))
        );
        assert_eq!(Shard::from_lease_name("shard:64"), None);
        assert_eq!(Shard::new(64), None);
    }
}
