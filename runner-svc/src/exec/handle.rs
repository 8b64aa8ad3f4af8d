//! [`Exec`]: one exec's handle, over the descriptors of its directory: its
//! progress, reading its records, watchers' acknowledgements, and asking
//! its supervisor to end it.

use std::{
    fs::File,
    os::unix::fs::FileExt,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{net::unix::pipe, sync::watch};

use super::{
    ExecError, Meta, Progress, bounds,
    files::{ExecFiles, read_ack},
    outage, scanner,
};
use crate::log::{self, Reason};

/// A watcher reports its progress to the supervisor every this many bytes.
const ACK_EVERY: u64 = 256 * 1024;

/// One exec.
pub struct Exec {
    pub meta: Meta,
    pub(super) log: Arc<File>,
    ack: File,
    acked: AtomicU64,
    ack_written: AtomicU64,
    /// Dropped (`None`) once stdin is closed or the exec has exited. Its
    /// lock orders writes and guards `stdin_sequence`.
    pub(super) stdin: Arc<tokio::sync::Mutex<Option<pipe::Sender>>>,
    /// The last stdin frame sequence written whole to the FIFO; changed
    /// only under `stdin`'s lock, read without it for reports.
    pub(super) stdin_sequence: AtomicU64,
    /// Only ever written without waiting: the agent can fill this FIFO.
    pub(super) control: Mutex<Option<pipe::Sender>>,
    /// Set when the runner ends the exec (terminate, timeout): the reason
    /// it reports, whatever the log says.
    pub(super) ending: Mutex<Option<Reason>>,
    pub(super) exited_at: Mutex<Option<std::time::Instant>>,
    pub(super) progress: watch::Sender<Progress>,
    /// What the log keeps, and where its records start.
    pub(super) kept: bounds::Kept,
    /// Its supervisor's host process, once the engine has named it.
    pub(super) host: Mutex<outage::Host>,
}

impl Exec {
    /// An exec over its files, nothing of its log read yet.
    pub(super) fn new(meta: Meta, files: ExecFiles) -> Exec {
        let acked = read_ack(&files.ack);
        Exec {
            log: Arc::new(files.log),
            ack: files.ack,
            acked: AtomicU64::new(acked),
            ack_written: AtomicU64::new(acked),
            stdin: Arc::new(tokio::sync::Mutex::new(Some(files.stdin))),
            stdin_sequence: AtomicU64::new(0),
            control: Mutex::new(Some(files.control)),
            ending: Mutex::new(None),
            exited_at: Mutex::new(None),
            progress: watch::Sender::new(Progress::default()),
            kept: bounds::Kept::default(),
            host: Mutex::new(
                meta.supervisor
                    .map_or(outage::Host::Unnamed, outage::Host::Named),
            ),
            meta,
        }
    }

    pub fn progress(&self) -> Progress {
        self.progress.borrow().clone()
    }

    /// The last stdin frame sequence the exec received (0: none).
    pub fn stdin_sequence(&self) -> u64 {
        self.stdin_sequence.load(Ordering::SeqCst)
    }

    pub fn subscribe(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    /// Reads the record at `pos`; returns it and its length.
    pub fn read_record(&self, pos: u64) -> Result<(log::Header, Vec<u8>), ExecError> {
        scanner::read_record(&*self.log, pos)
    }

    /// Asks the supervisor to end the exec, without waiting on the FIFO.
    pub(super) fn ask_to_end(&self, reason: Reason, grace: Duration) {
        self.ending.lock().expect("poisoned").get_or_insert(reason);
        let line = format!("term {}\n", grace.as_millis());
        if let Some(control) = self.control.lock().expect("poisoned").as_ref()
            && let Err(e) = control.try_write(line.as_bytes())
        {
            tracing::warn!(exec = %self.meta.exec_id, error = %e, "cannot reach the supervisor");
        }
    }

    /// Records that a watcher has read up to `pos`, releasing the supervisor's window.
    pub fn ack(&self, pos: u64, caught_up: bool) {
        let prev = self.acked.fetch_max(pos, Ordering::SeqCst).max(pos);
        let written = self.ack_written.load(Ordering::SeqCst);
        if prev >= written + ACK_EVERY || (caught_up && prev > written) {
            self.ack_written.store(prev, Ordering::SeqCst);
            if let Err(e) = self.ack.write_all_at(&prev.to_le_bytes(), 0) {
                tracing::warn!(exec = %self.meta.exec_id, error = %e, "cannot write ack");
            }
        }
    }
}
