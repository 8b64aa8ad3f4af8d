//! Bounds on what execs' logs keep on disk.
//!
//! An exec's log keeps at most [`LogLimits::per_exec`] bytes of the records
//! the runner has read, and all logs together at most [`LogLimits::total`].
//! Past a bound, the oldest records go: the runner punches a hole over them
//! (`FALLOC_FL_PUNCH_HOLE`), which frees their blocks while every offset
//! stays valid, so the supervisor goes on appending and nothing is copied.
//! A log past its bound is cut back to three quarters of it, so cuts are
//! few.
//!
//! Where a log now starts, its head (offset and sequence of the first kept
//! record), is written to the runner's own directory (`<exec>.head`) before
//! the hole is punched: a restarted runner reads the log from there. A
//! watcher whose next record was dropped gets a `Truncated` event and goes
//! on at the head; the last record read is always kept, so an exit is never
//! dropped.
//!
//! Cuts fall only on record boundaries the runner saw as it scanned
//! ([`Kept`]'s marks), never on what the log says later: an agent that
//! rewrites its log cannot move a cut.
//!
//! - `drop`: the cut takes read and unread records alike, and counts as
//!   read for the supervisor's window, so the agent never waits for it.
//! - `pause`: the supervisor's window is at most the bound, and a cut takes
//!   only what a watcher has read: the agent waits, as for a slow watcher.
//!
//! The total is kept by cutting exited execs' logs first (oldest exit
//! first), down to their exit record, then the largest logs, whatever the
//! policy.
//!
//! What a running exec's log takes on disk may pass its bound by what the
//! supervisor wrote since the runner last read it, which the output window
//! limits (watchers' acknowledgements and cuts are what let the supervisor
//! go on, and both follow the runner's reading), one record past it, and the
//! two partly used blocks at the log's ends. Under `pause`, whose cuts also
//! wait for the watcher, by up to twice the window.

use std::{
    collections::VecDeque,
    fs::File,
    io::ErrorKind,
    os::fd::AsFd,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use serde::{Deserialize, Serialize};

use super::{
    Exec, ExecError, Progress, Runner,
    files::meta_dir,
    scanner::{Scanner, read_header},
};
use crate::{config::LogPolicy, log};

/// Every this many records, the scanner marks a boundary (for
/// [`Exec::locate_after`], which walks the headers from one).
const MARK_EVERY: u64 = 256;
/// And at least every this many bytes (for cuts).
const MARK_BYTES: u64 = 64 * 1024;
/// Holes are punched from a multiple of this, so the block a previous cut
/// fell in is freed too.
const PUNCH_ALIGN: u64 = 64 * 1024;

/// How much the runner's logs keep.
#[derive(Clone, Copy, Debug)]
pub struct LogLimits {
    /// Bytes one exec's log keeps.
    pub per_exec: u64,
    /// Bytes all logs keep together.
    pub total: u64,
    pub policy: LogPolicy,
}

impl LogLimits {
    /// The supervisor's output window under these limits.
    pub fn window(&self, output_window: u64) -> u64 {
        match self.policy {
            LogPolicy::Drop => output_window,
            LogPolicy::Pause => output_window.min(self.per_exec),
        }
    }
}

/// What a log past `bound` is cut back to.
fn low_water(bound: u64) -> u64 {
    bound - bound / 4
}

/// Where a record starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Place {
    pub sequence: u64,
    pub offset: u64,
}

/// The head of an exec's log as the runner records it.
#[derive(Serialize, Deserialize)]
struct HeadRecord {
    /// The exec's uid, never reused: a record left by an earlier exec of
    /// the same id is not this one's.
    uid: u32,
    head: Place,
}

/// What an exec's log keeps, as far as the runner has read it.
pub(super) struct Kept {
    state: Mutex<KeptState>,
}

struct KeptState {
    /// The first kept record (or where the next one will be).
    head: Place,
    /// Record boundaries from the head on, in order; the first is the head
    /// once a record is kept.
    marks: VecDeque<Place>,
    /// The last record read, and where it ends.
    last: Option<Place>,
    end: u64,
    /// The furthest a watcher has read: where its next record starts.
    read: Option<Place>,
    /// Holes are punched below this.
    punched: u64,
    /// What this log adds to [`Logs::total`].
    counted: u64,
}

impl Default for Kept {
    fn default() -> Self {
        Kept {
            state: Mutex::new(KeptState {
                head: Place {
                    sequence: 1,
                    offset: 0,
                },
                marks: VecDeque::new(),
                last: None,
                end: 0,
                read: None,
                punched: 0,
                counted: 0,
            }),
        }
    }
}

impl Kept {
    fn lock(&self) -> std::sync::MutexGuard<'_, KeptState> {
        self.state.lock().expect("poisoned")
    }

    /// The first kept record.
    pub(super) fn head(&self) -> Place {
        self.lock().head
    }

    /// Records that the scanner read the record at `at`, `len` bytes.
    pub(super) fn note(&self, at: Place, len: u64) {
        let mut s = self.lock();
        let mark = s.marks.back().is_none_or(|m| {
            at.sequence - m.sequence >= MARK_EVERY || at.offset - m.offset >= MARK_BYTES
        });
        if mark {
            s.marks.push_back(at);
        }
        s.last = Some(at);
        s.end = at.offset + len;
    }

    /// The closest known boundary at or before record `sequence`: the head
    /// if that record was dropped.
    pub(super) fn boundary_before(&self, sequence: u64) -> Place {
        let s = self.lock();
        let i = s.marks.partition_point(|m| m.sequence <= sequence);
        match i {
            0 => s.head,
            i => s.marks[i - 1],
        }
    }

    /// Records that a watcher has read every record before `next`.
    pub(super) fn read_to(&self, next: Place) {
        let mut s = self.lock();
        if s.read.is_none_or(|r| r.offset < next.offset) {
            s.read = Some(next);
        }
    }

    /// Bytes kept of what the runner has read.
    fn bytes(&self) -> u64 {
        let s = self.lock();
        s.end.saturating_sub(s.head.offset)
    }

    /// Where to cut so that at most `keep` bytes stay (or as close as the
    /// boundaries allow), never past the last record nor, when `read_only`,
    /// past what a watcher has read; `None` if nothing can go.
    fn cut_for(&self, keep: u64, read_only: bool) -> Option<Place> {
        let s = self.lock();
        let last = s.last?;
        let mut limit = last;
        if read_only {
            limit = match s.read {
                Some(read) if read.offset < limit.offset => read,
                Some(_) => limit,
                None => return None,
            };
        }
        let at = s
            .marks
            .iter()
            .copied()
            .find(|m| s.end - m.offset <= keep)
            .unwrap_or(last);
        let at = if at.offset > limit.offset { limit } else { at };
        (at.offset > s.head.offset).then_some(at)
    }
}

/// The runner's account of all logs.
#[derive(Default)]
pub(super) struct Logs {
    /// Bytes kept by every log, as last counted.
    total: AtomicU64,
    /// Held while the total is being brought down.
    cutting: Mutex<()>,
}

/// The next thing a watcher gets.
pub enum Next {
    Record(log::Header, Vec<u8>),
    /// The record it asked for was dropped; the log goes on at this head.
    Dropped(Place),
}

impl Exec {
    /// Offset of the record after `after`, which must exist or be the next
    /// one; the head's if that record was dropped.
    pub fn locate_after(&self, after: u64, progress: &Progress) -> Result<u64, ExecError> {
        if after > progress.last_sequence {
            return Err(ExecError::OutOfRange(format!(
                "sequence {after} is beyond the last one, {}",
                progress.last_sequence
            )));
        }
        if after == progress.last_sequence {
            return Ok(progress.end);
        }
        let from = self.kept.boundary_before(after + 1);
        let mut pos = from.offset;
        for _ in from.sequence.min(after + 1)..after + 1 {
            match read_header(&*self.log, pos) {
                Ok(header) => pos += header.record_len(),
                // Dropped while walking: the watcher is told.
                Err(_) if self.kept.head().sequence > after + 1 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(pos)
    }

    /// The record after sequence `seq`, which starts at `pos` unless it was dropped.
    pub fn next_record(&self, seq: u64, pos: u64) -> Result<Next, ExecError> {
        let dropped = || {
            let head = self.kept.head();
            (seq + 1 < head.sequence).then_some(head)
        };
        if let Some(head) = dropped() {
            return Ok(Next::Dropped(head));
        }
        let read = self.read_record(pos);
        // A cut publishes the head before it punches: if the head has not
        // moved past the record now, the bytes read were the record's.
        if let Some(head) = dropped() {
            return Ok(Next::Dropped(head));
        }
        let (header, payload) = read?;
        Ok(Next::Record(header, payload))
    }

    /// Records that a watcher has read up to sequence `seq`, which ends at `pos`.
    pub fn read_to(&self, seq: u64, pos: u64) {
        self.kept.read_to(Place {
            sequence: seq + 1,
            offset: pos,
        });
    }

    /// Bytes dropped from the start of the log.
    pub fn dropped_bytes(&self) -> u64 {
        self.kept.head().offset
    }
}

impl Runner {
    fn head_path(&self, exec_id: &str) -> PathBuf {
        meta_dir(&self.settings).join(format!("{exec_id}.head"))
    }

    /// A scanner that reads `exec`'s log from its recorded head, for an exec
    /// found again after a restart. Its dropped head is punched again, in
    /// case the runner stopped between recording the head and punching.
    pub(super) fn resume_scanner(&self, exec: &Exec) -> Scanner {
        let path = self.head_path(&exec.meta.exec_id);
        let record: Option<HeadRecord> = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .inspect_err(|e| tracing::warn!(exec = %exec.meta.exec_id, error = %e, "unreadable log head; reading the log from its start"))
                .ok(),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => {
                tracing::warn!(exec = %exec.meta.exec_id, error = %e, "cannot read the log head; reading the log from its start");
                None
            }
        };
        let Some(HeadRecord { head, .. }) = record.filter(|r| r.uid == exec.meta.uid) else {
            return Scanner::default();
        };
        {
            let mut s = exec.kept.lock();
            s.head = head;
            s.end = head.offset;
            s.punched = head.offset;
        }
        punch(&exec.log, 0, head.offset, &exec.meta.exec_id);
        Scanner {
            pos: head.offset,
            seq: head.sequence - 1,
            exit_at: 0,
        }
    }

    /// Keeps `exec`'s log, then all logs, within their bounds, after the
    /// follower has read more of it.
    pub(super) async fn bound_logs(self: &Arc<Self>, exec: &Arc<Exec>) {
        let (runner, exec) = (self.clone(), exec.clone());
        if let Err(e) = tokio::task::spawn_blocking(move || runner.bound_now(&exec)).await {
            tracing::warn!(error = %e, "bounding the logs failed");
        }
    }

    fn bound_now(&self, exec: &Exec) {
        let limits = self.settings.logs;
        if exec.kept.bytes() > limits.per_exec {
            let read_only = limits.policy == LogPolicy::Pause;
            if let Some(at) = exec.kept.cut_for(low_water(limits.per_exec), read_only) {
                self.cut(exec, at);
            }
        }
        self.count(exec);
        if self.logs.total.load(Ordering::SeqCst) > limits.total {
            self.bound_total();
        }
    }

    /// Brings all logs together back under their bound: exited execs'
    /// first, oldest exit first, then the largest.
    fn bound_total(&self) {
        let Ok(_cutting) = self.logs.cutting.try_lock() else {
            // Another follower is at it.
            return;
        };
        let total = self.logs.total.load(Ordering::SeqCst);
        let mut need = total.saturating_sub(low_water(self.settings.logs.total));
        let execs = self.list(None);
        let exited_at = |e: &Arc<Exec>| *e.exited_at.lock().expect("poisoned");
        let mut exited: Vec<_> = execs.iter().filter(|e| exited_at(e).is_some()).collect();
        exited.sort_by_key(|e| exited_at(e));
        let mut running: Vec<_> = execs
            .iter()
            .filter(|e| exited_at(e).is_none())
            .map(|e| (e.kept.bytes(), e))
            .collect();
        running.sort_by_key(|(bytes, _)| std::cmp::Reverse(*bytes));
        for exec in exited
            .into_iter()
            .chain(running.into_iter().map(|(_, e)| e))
        {
            if need == 0 {
                break;
            }
            let before = exec.kept.bytes();
            if let Some(at) = exec.kept.cut_for(before.saturating_sub(need), false) {
                self.cut(exec, at);
            }
            self.count(exec);
            need = need.saturating_sub(before - exec.kept.bytes().min(before));
        }
    }

    /// Brings [`Logs::total`] up to date with `exec`'s log.
    fn count(&self, exec: &Exec) {
        let mut s = exec.kept.lock();
        let now = s.end.saturating_sub(s.head.offset);
        let before = std::mem::replace(&mut s.counted, now);
        if now >= before {
            self.logs.total.fetch_add(now - before, Ordering::SeqCst);
        } else {
            self.logs.total.fetch_sub(before - now, Ordering::SeqCst);
        }
    }

    /// Drops every record of `exec`'s log before `at`: records the new head
    /// where a restarted runner finds it, publishes it, then punches.
    fn cut(&self, exec: &Exec, at: Place) {
        let id = &exec.meta.exec_id;
        let from = {
            let mut s = exec.kept.lock();
            if at.offset <= s.head.offset {
                return;
            }
            let record = HeadRecord {
                uid: exec.meta.uid,
                head: at,
            };
            if let Err(e) = write_head(&self.head_path(id), &record) {
                tracing::warn!(exec = %id, error = %e, "cannot record the log head; keeping the log whole");
                return;
            }
            s.head = at;
            while s.marks.front().is_some_and(|m| m.offset < at.offset) {
                s.marks.pop_front();
            }
            if s.marks.front() != Some(&at) {
                s.marks.push_front(at);
            }
            std::mem::replace(&mut s.punched, at.offset)
        };
        punch(&exec.log, from, at.offset, id);
        crate::metrics::log_dropped(at.offset - from);
        tracing::debug!(exec = %id, first_kept = at.sequence, dropped_bytes = at.offset, "dropped the oldest output");
        // What is dropped needs no reading: the supervisor's window moves on.
        exec.ack(at.offset, true);
    }

    /// Forgets the log of an exec that is forgotten.
    pub(super) fn forget_log(&self, exec: &Exec) {
        let counted = std::mem::take(&mut exec.kept.lock().counted);
        self.logs.total.fetch_sub(counted, Ordering::SeqCst);
        if let Err(e) = std::fs::remove_file(self.head_path(&exec.meta.exec_id))
            && e.kind() != ErrorKind::NotFound
        {
            tracing::warn!(exec = %exec.meta.exec_id, error = %e, "cannot remove a log head");
        }
    }
}

fn write_head(path: &std::path::Path, record: &HeadRecord) -> anyhow::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, serde_json::to_vec(record)?)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Frees the blocks of `[from, to)` (from rounded down), keeping the size.
fn punch(file: &File, from: u64, to: u64, exec_id: &str) {
    use nix::fcntl::{FallocateFlags, fallocate};
    let from = from - from % PUNCH_ALIGN;
    if to <= from {
        return;
    }
    let (Ok(start), Ok(len)) = (i64::try_from(from), i64::try_from(to - from)) else {
        return;
    };
    let flags = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    if let Err(e) = fallocate(file.as_fd(), flags, start, len) {
        tracing::warn!(exec = %exec_id, error = %e, "cannot punch the dropped output out of the log");
    }
}
