//! The log scanner: it advances over the complete records the supervisor
//! has appended, from where it stopped, notes each record's place for the
//! bounds, publishes the exec's progress, and returns the exit record once
//! read. A partial record at the end waits for the rest; a bad header is
//! an error, which ends the exec.
//!
//! It reads through [`LogBytes`], so what it decides is tested on bytes in
//! memory.

use std::{fs::File, os::unix::fs::FileExt, sync::Arc};

use anyhow::Context;

use super::{Exec, ExecError, Place};
use crate::log::{self, Exit, HEADER_LEN, Kind};

/// What records are read from: an exec's log, or bytes in memory.
pub(super) trait LogBytes {
    /// How many bytes there are.
    fn size(&self) -> std::io::Result<u64>;
    /// Fills `buf` from offset `pos`.
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<()>;
}

impl LogBytes for File {
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<()> {
        FileExt::read_exact_at(self, buf, pos)
    }
}

/// Reads the header of the record at `pos`.
pub(super) fn read_header<L: LogBytes + ?Sized>(
    source: &L,
    pos: u64,
) -> Result<log::Header, ExecError> {
    let mut bytes = [0u8; HEADER_LEN];
    source
        .read_exact_at(&mut bytes, pos)
        .context("cannot read the exec log")?;
    Ok(log::decode_header(&bytes).map_err(anyhow::Error::from)?)
}

/// Reads the record at `pos`: its header and its payload.
pub(super) fn read_record<L: LogBytes + ?Sized>(
    source: &L,
    pos: u64,
) -> Result<(log::Header, Vec<u8>), ExecError> {
    let header = read_header(source, pos)?;
    let mut payload = vec![0u8; header.len as usize];
    source
        .read_exact_at(&mut payload, pos + HEADER_LEN as u64)
        .context("cannot read the exec log")?;
    Ok((header, payload))
}

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
        let start_seq = self.seq;
        let exit = self.advance(&*exec.log, |at, len| exec.kept.note(at, len))?;
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

    /// Advances over the complete records of `source`, telling `note` where
    /// each starts and its length; stops after the exit record and returns
    /// the exit.
    fn advance<L: LogBytes + ?Sized>(
        &mut self,
        source: &L,
        mut note: impl FnMut(Place, u64),
    ) -> anyhow::Result<Option<Exit>> {
        let len = source.size()?;
        if len < self.pos {
            return Err(log::Corrupt("the log shrank").into());
        }
        let mut exit = None;
        while self.pos + HEADER_LEN as u64 <= len {
            let header = read_header(source, self.pos).map_err(|e| anyhow::anyhow!("{e}"))?;
            if self.pos + header.record_len() > len {
                break;
            }
            if header.kind == Kind::Exited {
                self.exit_at = self.pos;
                let (_, payload) =
                    read_record(source, self.pos).map_err(|e| anyhow::anyhow!("{e}"))?;
                exit = Some(log::decode_exit(&payload)?);
            }
            note(
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
        Ok(exit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::Reason;

    impl LogBytes for [u8] {
        fn size(&self) -> std::io::Result<u64> {
            Ok(self.len() as u64)
        }

        fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<()> {
            let from = usize::try_from(pos).map_err(std::io::Error::other)?;
            let bytes = self
                .get(from..from + buf.len())
                .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
            buf.copy_from_slice(bytes);
            Ok(())
        }
    }

    /// Scans `bytes`, returning the exit and every record noted.
    fn scan(
        scanner: &mut Scanner,
        bytes: &[u8],
    ) -> (anyhow::Result<Option<Exit>>, Vec<(Place, u64)>) {
        let mut noted = Vec::new();
        let result = scanner.advance(bytes, |at, len| noted.push((at, len)));
        (result, noted)
    }

    fn exit() -> Exit {
        Exit {
            code: 3,
            reason: Reason::Exited,
            detail: "done".into(),
        }
    }

    fn place(sequence: u64, offset: u64) -> Place {
        Place { sequence, offset }
    }

    #[test]
    fn complete_records_are_read_up_to_the_exit() {
        let records = [
            log::encode(Kind::Started, &log::started_payload(42)),
            log::encode(Kind::Stdout, b"hello"),
            log::encode(Kind::Stderr, b""),
            log::encode(Kind::Exited, &log::exit_payload(&exit())),
            // Nothing after the exit is read.
            log::encode(Kind::Stdout, b"late"),
        ];
        let bytes = records.concat();
        let mut scanner = Scanner::default();
        let (result, noted) = scan(&mut scanner, &bytes);
        assert_eq!(result.unwrap(), Some(exit()));
        let lens: Vec<u64> = records.iter().map(|r| r.len() as u64).collect();
        let mut at = 0;
        let expected: Vec<(Place, u64)> = lens[..4]
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let step = (place(i as u64 + 1, at), len);
                at += len;
                step
            })
            .collect();
        assert_eq!(noted, expected);
        assert_eq!(scanner.seq, 4);
        assert_eq!(scanner.pos, at);
        assert_eq!(scanner.exit_at, lens[..3].iter().sum::<u64>());
    }

    #[test]
    fn a_partial_record_waits_for_the_rest() {
        let first = log::encode(Kind::Stdout, b"one");
        let second = log::encode(Kind::Stdout, b"two, longer");
        let end = first.len() as u64;
        let mut scanner = Scanner::default();
        // Part of a header, then a header without all its payload.
        for cut in [first.len() + 5, first.len() + HEADER_LEN + 4] {
            let bytes = [&first[..], &second[..cut - first.len()]].concat();
            let (result, _) = scan(&mut scanner, &bytes);
            assert_eq!(result.unwrap(), None);
            assert_eq!((scanner.seq, scanner.pos), (1, end));
        }
        // The rest lands: the scanner goes on where it stopped.
        let bytes = [first, second.clone()].concat();
        let (result, noted) = scan(&mut scanner, &bytes);
        assert_eq!(result.unwrap(), None);
        assert_eq!(noted, vec![(place(2, end), second.len() as u64)]);
        assert_eq!((scanner.seq, scanner.pos), (2, bytes.len() as u64));
        // Nothing new: nothing noted.
        let (result, noted) = scan(&mut scanner, &bytes);
        assert_eq!(result.unwrap(), None);
        assert!(noted.is_empty());
    }

    #[test]
    fn a_corrupt_header_is_an_error() {
        let good = log::encode(Kind::Stdout, b"ok");
        let mut unknown = log::encode(Kind::Stdout, b"x");
        unknown[0] = 9;
        let mut huge = log::encode(Kind::Stdout, b"x");
        huge[1..5].copy_from_slice(&(log::MAX_PAYLOAD + 1).to_le_bytes());
        for (bad, why) in [(unknown, "unknown record kind"), (huge, "record too large")] {
            let mut scanner = Scanner::default();
            let (result, noted) = scan(&mut scanner, &[&good[..], &bad[..]].concat());
            let error = result.unwrap_err().to_string();
            assert!(error.contains(why), "{error}");
            // What came before the bad record was read.
            assert_eq!(noted, vec![(place(1, 0), good.len() as u64)]);
        }
    }

    #[test]
    fn a_corrupt_exit_and_a_shrunk_log_are_errors() {
        let mut scanner = Scanner::default();
        let bad_exit = log::encode(Kind::Exited, &[1, 2]);
        let (result, _) = scan(&mut scanner, &bad_exit);
        assert!(result.unwrap_err().to_string().contains("bad exit"));

        let bytes = log::encode(Kind::Stdout, b"gone");
        let mut scanner = Scanner::default();
        scan(&mut scanner, &bytes).0.unwrap();
        let (result, _) = scan(&mut scanner, &bytes[..4]);
        assert!(result.unwrap_err().to_string().contains("the log shrank"));
    }
}
