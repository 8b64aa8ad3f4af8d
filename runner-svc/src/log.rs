//! The per-exec output log, the one place an exec's events live.
//!
//! The supervisor inside the container appends records to `output.log` in
//! the exec's directory; the runner on the host reads them back by offset.
//! Because the log is a file, neither a runner restart nor a slow watcher
//! loses a byte the log keeps, and a watcher resumes at any sequence. The
//! runner keeps the log within its bounds by punching out its oldest
//! records (see `exec::bounds`); offsets and sequences never change.
//!
//! A record is a 13-byte header, then its payload:
//!
//! | bytes | field |
//! |---|---|
//! | 1 | kind: 1 started, 2 stdout, 3 stderr, 4 exited |
//! | 4 | payload length, little endian |
//! | 8 | time written, microseconds since the Unix epoch, little endian |
//!
//! Payloads: started carries the process id (i64 LE); stdout and stderr
//! the raw bytes; exited the exit code (i32 LE), the reason (one byte, the
//! `ExitReason` numbers of the proto) and a UTF-8 detail. A record's
//! sequence number is its position in the file, from 1.
//!
//! The agent owns the file (it runs as the same uid as its supervisor), so
//! the reader treats it as untrusted input: a bad record ends the exec's
//! log, it never panics or allocates more than [`MAX_PAYLOAD`].

use std::time::{SystemTime, UNIX_EPOCH};

/// Length of a record header.
pub const HEADER_LEN: usize = 13;
/// Largest payload a reader accepts.
pub const MAX_PAYLOAD: u32 = 1 << 20;
/// Longest exit detail a reader keeps.
pub const MAX_DETAIL: usize = 1024;
/// Largest output chunk the supervisor writes as one record.
pub const CHUNK: usize = 64 * 1024;

/// What a record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Started = 1,
    Stdout = 2,
    Stderr = 3,
    Exited = 4,
}

impl Kind {
    fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            1 => Self::Started,
            2 => Self::Stdout,
            3 => Self::Stderr,
            4 => Self::Exited,
            _ => return None,
        })
    }
}

/// Why an exec ended; the numbers are those of `troupe.runner.v1.ExitReason`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Exited = 1,
    Killed = 2,
    TimedOut = 3,
    ContainerLost = 4,
    /// No process could be made for it: the container's or its uid's limit.
    NoResources = 5,
}

impl Reason {
    fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            1 => Self::Exited,
            2 => Self::Killed,
            3 => Self::TimedOut,
            4 => Self::ContainerLost,
            5 => Self::NoResources,
            _ => return None,
        })
    }
}

/// The end of an exec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    pub code: i32,
    pub reason: Reason,
    pub detail: String,
}

/// A decoded record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub len: u32,
    pub at_micros: u64,
}

impl Header {
    /// Bytes the whole record takes.
    pub fn record_len(&self) -> u64 {
        HEADER_LEN as u64 + u64::from(self.len)
    }
}

/// The log holds something no supervisor writes.
#[derive(Debug, thiserror::Error)]
#[error("corrupt exec log: {0}")]
pub struct Corrupt(pub &'static str);

/// Decodes a header.
pub fn decode_header(bytes: &[u8; HEADER_LEN]) -> Result<Header, Corrupt> {
    let kind = Kind::from_byte(bytes[0]).ok_or(Corrupt("unknown record kind"))?;
    let len = u32::from_le_bytes(bytes[1..5].try_into().expect("4 bytes"));
    if len > MAX_PAYLOAD {
        return Err(Corrupt("record too large"));
    }
    let at_micros = u64::from_le_bytes(bytes[5..13].try_into().expect("8 bytes"));
    Ok(Header {
        kind,
        len,
        at_micros,
    })
}

/// Encodes one record, header and payload, ready for a single `write`.
pub fn encode(kind: Kind, payload: &[u8]) -> Vec<u8> {
    encode_at(kind, payload, now_micros())
}

fn encode_at(kind: Kind, payload: &[u8], at_micros: u64) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("payloads are chunked");
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.push(kind as u8);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&at_micros.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Payload of a started record.
pub fn started_payload(pid: i64) -> Vec<u8> {
    pid.to_le_bytes().to_vec()
}

/// Decodes a started record's payload.
pub fn decode_started(payload: &[u8]) -> Result<i64, Corrupt> {
    let bytes: [u8; 8] = payload.try_into().map_err(|_| Corrupt("bad started"))?;
    Ok(i64::from_le_bytes(bytes))
}

/// Payload of an exited record.
pub fn exit_payload(exit: &Exit) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + exit.detail.len());
    out.extend_from_slice(&exit.code.to_le_bytes());
    out.push(exit.reason as u8);
    out.extend_from_slice(exit.detail.as_bytes());
    out
}

/// Decodes an exited record's payload.
pub fn decode_exit(payload: &[u8]) -> Result<Exit, Corrupt> {
    if payload.len() < 5 {
        return Err(Corrupt("bad exit"));
    }
    let code = i32::from_le_bytes(payload[..4].try_into().expect("4 bytes"));
    let reason = Reason::from_byte(payload[4]).ok_or(Corrupt("bad exit reason"))?;
    let detail = &payload[5..];
    let detail = String::from_utf8_lossy(&detail[..detail.len().min(MAX_DETAIL)]).into_owned();
    Ok(Exit {
        code,
        reason,
        detail,
    })
}

/// Microseconds since the Unix epoch.
pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let exit = Exit {
            code: -3,
            reason: Reason::TimedOut,
            detail: "after 5s".into(),
        };
        let bytes = encode_at(Kind::Exited, &exit_payload(&exit), 42);
        let header = decode_header(bytes[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(
            header,
            Header {
                kind: Kind::Exited,
                len: 13,
                at_micros: 42
            }
        );
        assert_eq!(header.record_len(), bytes.len() as u64);
        assert_eq!(decode_exit(&bytes[HEADER_LEN..]).unwrap(), exit);
        assert_eq!(decode_started(&started_payload(-7)).unwrap(), -7);
    }

    #[test]
    fn garbage_is_refused() {
        let mut bytes = encode_at(Kind::Stdout, b"x", 1);
        bytes[0] = 9;
        assert!(decode_header(bytes[..HEADER_LEN].try_into().unwrap()).is_err());
        let mut big = [0u8; HEADER_LEN];
        big[0] = Kind::Stdout as u8;
        big[1..5].copy_from_slice(&(MAX_PAYLOAD + 1).to_le_bytes());
        assert!(decode_header(&big).is_err());
        assert!(decode_exit(&[1, 2]).is_err());
        assert!(decode_exit(&[0, 0, 0, 0, 77]).is_err());
        assert!(decode_started(&[1]).is_err());
    }
}
