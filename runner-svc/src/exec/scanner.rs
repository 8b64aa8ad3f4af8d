//! The log scanner: it advances over the complete records the supervisor
//! has appended, from where it stopped, notes each record's place for the
//! bounds, publishes the exec's progress, and returns the exit record once
//! read. A partial record at the end waits for the rest; a bad header is
//! an error, which ends the exec.

use std::sync::Arc;

use super::{Exec, Place, handle::read_header};
use crate::log::{self, Exit, HEADER_LEN, Kind};

/// Parses record headers from where it stopped.
#[derive(Default)]
pub(super) struct Scanner {
    pub(super) pos: u64,
    pub(super) seq: u64,
    /// Offset of the exit record, once read.
    pub(super) exit_at: u64,
}

impl Scanner {
    /// [`Scanner::scan`] off the async threads: a log may hold many records.
    pub(super) async fn scan_blocking(&mut self, exec: &Arc<Exec>) -> anyhow::Result<Option<Exit>> {
        let mut scanner = std::mem::take(self);
        let exec = exec.clone();
        let (scanner, result) = tokio::task::spawn_blocking(move || {
            let result = scanner.scan(&exec);
            (scanner, result)
        })
        .await?;
        *self = scanner;
        result
    }

    /// Advances over complete records, publishing progress; returns the exit once read.
    fn scan(&mut self, exec: &Exec) -> anyhow::Result<Option<Exit>> {
        let len = exec.log.metadata()?.len();
        if len < self.pos {
            return Err(log::Corrupt("the log shrank").into());
        }
        let mut exit = None;
        let start_seq = self.seq;
        while self.pos + HEADER_LEN as u64 <= len {
            let header = read_header(&exec.log, self.pos).map_err(|e| anyhow::anyhow!("{e}"))?;
            if self.pos + header.record_len() > len {
                break;
            }
            if header.kind == Kind::Exited {
                self.exit_at = self.pos;
                let (_, payload) = exec
                    .read_record(self.pos)
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                exit = Some(log::decode_exit(&payload)?);
            }
            exec.kept.note(
                Place {
                    sequence: self.seq + 1,
                    offset: self.pos,
                },
                header.record_len(),
            );
            self.seq += 1;
            self.pos += header.record_len();
            if exit.is_some() {
                break;
            }
        }
        if self.seq != start_seq {
            // The exit record is published with the exit itself, by `finish`.
            let (seq, end) = match &exit {
                Some(_) => (self.seq - 1, self.exit_at),
                None => (self.seq, self.pos),
            };
            exec.progress.send_modify(|p| {
                p.last_sequence = seq;
                p.end = end;
            });
        }
        Ok(exit)
    }
}
