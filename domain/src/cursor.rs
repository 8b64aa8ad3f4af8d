//! Cursors: where a watcher stands in the event log.
//!
//! The log is ordered per shard, not fleet-wide: each shard numbers its
//! events in commit order (an event's `shard_seq`, from 1), and commits of
//! different shards never wait on one another. A workspace (and so a tree,
//! a session) lies in one shard, so its events keep one order. A cursor
//! holds, for each shard a watch covers, the last position seen there;
//! resuming at it sends what came after, shard by shard.
//!
//! Its text form, the one a client holds, is `shard:position` pairs joined
//! by commas (`22:1234`, or `0:17,1:4,...` for a watch of every
//! workspace); the empty text starts at the oldest event kept. A shard the
//! text does not name stands at position 0 (before its first event), so a
//! cursor of one workspace given to a watch of all of them is refused as
//! expired where older events are gone, never read with a gap. The numeric
//! cursors of releases before shards do not parse, and say so.

use std::{collections::BTreeMap, fmt, str::FromStr};

use crate::shard::{SHARDS, Shard, ShardSet};

/// The last position seen in each shard of a watch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cursor(BTreeMap<Shard, i64>);

impl Cursor {
    /// A cursor at `position` in each of `shards` (their heads, or their
    /// pruning marks: see [`Cursor::at`]).
    pub fn at(positions: impl IntoIterator<Item = (Shard, i64)>) -> Cursor {
        Cursor(positions.into_iter().collect())
    }

    /// The last position seen in `shard` (0: none).
    pub fn after(&self, shard: Shard) -> i64 {
        self.0.get(&shard).copied().unwrap_or(0)
    }

    /// Moves past `position` of `shard` (never back).
    pub fn advance(&mut self, shard: Shard, position: i64) {
        let at = self.0.entry(shard).or_insert(0);
        *at = (*at).max(position);
    }

    /// Only the positions of `shards` (those a watch covers).
    pub fn within(&self, shards: ShardSet) -> Cursor {
        Cursor(
            shards
                .iter()
                .map(|shard| (shard, self.after(shard)))
                .collect(),
        )
    }

    /// Whether the cursor names no shard (its text is empty).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The positions it names, by shard.
    pub fn iter(&self) -> impl Iterator<Item = (Shard, i64)> + '_ {
        self.0.iter().map(|(shard, at)| (*shard, *at))
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (shard, at)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{shard}:{at}")?;
        }
        Ok(())
    }
}

/// Each shard's newest position and the last one pruned: where a watch
/// that starts at the oldest event kept, or at the live end, stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heads {
    newest: [i64; SHARDS as usize],
    pruned: [i64; SHARDS as usize],
}

impl Default for Heads {
    fn default() -> Self {
        Heads {
            newest: [0; SHARDS as usize],
            pruned: [0; SHARDS as usize],
        }
    }
}

impl Heads {
    /// Records `shard`'s newest position and its last pruned one.
    pub fn set(&mut self, shard: Shard, newest: i64, pruned: i64) {
        self.newest[usize::from(shard.index())] = newest;
        self.pruned[usize::from(shard.index())] = pruned;
    }

    pub fn newest(&self, shard: Shard) -> i64 {
        self.newest[usize::from(shard.index())]
    }

    pub fn pruned(&self, shard: Shard) -> i64 {
        self.pruned[usize::from(shard.index())]
    }

    /// A cursor of `shards` before their oldest events kept.
    pub fn oldest_kept(&self, shards: ShardSet) -> Cursor {
        Cursor::at(shards.iter().map(|s| (s, self.pruned(s))))
    }

    /// A cursor of `shards` at their newest events: the live end.
    pub fn live(&self, shards: ShardSet) -> Cursor {
        Cursor::at(shards.iter().map(|s| (s, self.newest(s))))
    }
}

/// Why a cursor's text was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CursorError {
    #[error(
        "`{0}` is a numeric cursor of a release before sharded event logs; \
         cursors are now `shard:position` pairs, as each event's cursor gives them: \
         start again from the oldest event kept (an empty cursor), or from the live end"
    )]
    Numeric(String),
    #[error("not a cursor: expected `shard:position` pairs joined by commas")]
    Malformed,
    #[error("cursor names shard {0}, which does not exist")]
    NoSuchShard(String),
    #[error("cursor names shard {0} twice")]
    Repeated(Shard),
    #[error("a cursor is at most {MAX_TEXT} bytes (a pair per shard)")]
    TooLong,
}

/// The longest text a cursor can have: a pair per shard, each at most
/// `63:9223372036854775807,` (23 bytes).
pub const MAX_TEXT: usize = SHARDS as usize * 23;

impl FromStr for Cursor {
    type Err = CursorError;

    fn from_str(text: &str) -> Result<Cursor, CursorError> {
        if text.len() > MAX_TEXT {
            return Err(CursorError::TooLong);
        }
        let text = text.trim();
        if text.is_empty() {
            return Ok(Cursor::default());
        }
        if text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(CursorError::Numeric(text.to_owned()));
        }
        let mut positions = BTreeMap::new();
        for pair in text.split(',') {
            let (shard, at) = pair.trim().split_once(':').ok_or(CursorError::Malformed)?;
            let n: u16 = shard.parse().map_err(|_| CursorError::Malformed)?;
            let shard = Shard::new(n).ok_or_else(|| CursorError::NoSuchShard(n.to_string()))?;
            let at: i64 = at.parse().map_err(|_| CursorError::Malformed)?;
            if at < 0 {
                return Err(CursorError::Malformed);
            }
            if positions.insert(shard, at).is_some() {
                return Err(CursorError::Repeated(shard));
            }
        }
        Ok(Cursor(positions))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(n: u16) -> Shard {
        Shard::new(n).unwrap()
    }

    #[test]
    fn a_cursor_reads_back_from_its_text() {
        let mut cursor = Cursor::at([(shard(3), 0), (shard(22), 1234)]);
        cursor.advance(shard(3), 7);
        cursor.advance(shard(22), 9); // never back
        assert_eq!(cursor.to_string(), "3:7,22:1234");
        assert_eq!("3:7,22:1234".parse::<Cursor>().unwrap(), cursor);
        assert_eq!(" 22:1234 , 3:7".parse::<Cursor>().unwrap(), cursor);
        assert_eq!("".parse::<Cursor>().unwrap(), Cursor::default());
        assert_eq!(cursor.after(shard(5)), 0, "an unnamed shard stands at 0");
    }

    #[test]
    fn within_keeps_only_the_watched_shards_and_names_each() {
        let cursor = Cursor::at([(shard(1), 5), (shard(2), 6)]);
        let only: ShardSet = [shard(2), shard(9)].into_iter().collect();
        assert_eq!(cursor.within(only).to_string(), "2:6,9:0");
    }

    #[test]
    fn bad_text_is_refused_with_what_was_wrong() {
        assert!(matches!(
            "1234".parse::<Cursor>(),
            Err(CursorError::Numeric(_))
        ));
        for bad in ["22:", ":5", "a:b", "22:-1", "22:5,", "22:5;3:1"] {
            assert!(
                matches!(bad.parse::<Cursor>(), Err(CursorError::Malformed)),
                "{bad}"
            );
        }
        assert_eq!(
            "64:1".parse::<Cursor>(),
            Err(CursorError::NoSuchShard("64".into()))
        );
        assert_eq!(
            "3:1,3:2".parse::<Cursor>(),
            Err(CursorError::Repeated(shard(3)))
        );
        assert_eq!(
            "1:1,".repeat(1000).parse::<Cursor>(),
            Err(CursorError::TooLong)
        );
        let every = Cursor::at(Shard::all().map(|s| (s, i64::MAX)));
        assert_eq!(
            every.to_string().parse::<Cursor>(),
            Ok(every),
            "the longest reads back"
        );
        let numeric = "1234".parse::<Cursor>().unwrap_err().to_string();
        assert!(numeric.contains("release before"), "{numeric}");
    }
}
