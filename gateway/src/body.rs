//! A request's body, read only once its token is known to be a live
//! session's ([`super::Gateway`] checks it from the headers first), and
//! never past [`MAX_REQUEST_BYTES`]: a `Content-Length` over it is refused
//! before a byte is read, a chunked body once it passes it. Either way
//! `413` in the API's shape.
//!
//! The bytes of requests held at once are bounded too ([`InFlight`]): a
//! session's ([`MAX_SESSION_BYTES`]) and all sessions' together
//! ([`MAX_TOTAL_BYTES`]), counted as they arrive (what is only declared
//! holds nothing) and until the call ends. Past either, `429` in the API's
//! shape: one agent's thirty large posts at once cannot take the service's
//! memory. A body that stops arriving for the gateway's `timeouts.body_ms`
//! (30 s unless configured) is refused, so nobody holds counted bytes by
//! sending no more.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    body::{Body, Bytes},
    http::{HeaderMap, header},
};
use http_body_util::BodyExt;

use super::shape::{ApiError, Kind};

/// Largest request body the gateway takes: the Messages API's own bound
/// (32 MB), a conversation that long is the provider's to refuse anyway.
pub const MAX_REQUEST_BYTES: usize = 32 << 20;

/// Most bytes of one session's requests held at once: two of the largest.
pub const MAX_SESSION_BYTES: usize = 2 * MAX_REQUEST_BYTES;

/// Most bytes of all sessions' requests held at once.
pub const MAX_TOTAL_BYTES: usize = 512 << 20;

fn too_large() -> ApiError {
    ApiError::new(
        Kind::TooLarge,
        format!(
            "the request body is larger than the gateway takes ({} MiB)",
            MAX_REQUEST_BYTES >> 20
        ),
    )
}

/// The bytes of requests held, by session and in all.
#[derive(Debug, Default)]
pub struct InFlight {
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    sessions: HashMap<String, usize>,
}

/// One request's bytes, counted in flight until dropped.
#[derive(Debug)]
pub struct Held {
    inflight: Arc<InFlight>,
    session: String,
    bytes: usize,
}

impl InFlight {
    /// Counts nothing yet for `session`'s request.
    pub fn hold(self: &Arc<Self>, session: &str) -> Held {
        Held {
            inflight: self.clone(),
            session: session.to_owned(),
            bytes: 0,
        }
    }
}

impl Held {
    /// Counts `n` more bytes, if the session's and the total bound allow.
    fn take(&mut self, n: usize) -> Result<(), ApiError> {
        let mut counts = self.inflight.counts.lock().expect("in-flight counts");
        let session = counts.sessions.get(&self.session).copied().unwrap_or(0);
        if session + n > MAX_SESSION_BYTES {
            return Err(ApiError::new(
                Kind::Busy,
                format!(
                    "session {} has {} MiB of requests in flight, the most it may: retry when one has ended",
                    self.session,
                    MAX_SESSION_BYTES >> 20
                ),
            ));
        }
        if counts.total + n > MAX_TOTAL_BYTES {
            return Err(ApiError::new(
                Kind::Busy,
                "the gateway holds as many request bytes as it takes: retry shortly",
            ));
        }
        counts.total += n;
        *counts.sessions.entry(self.session.clone()).or_default() += n;
        self.bytes += n;
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        let Ok(mut counts) = self.inflight.counts.lock() else {
            return;
        };
        counts.total = counts.total.saturating_sub(self.bytes);
        if let Some(n) = counts.sessions.get_mut(&self.session) {
            *n = n.saturating_sub(self.bytes);
            if *n == 0 {
                counts.sessions.remove(&self.session);
            }
        }
    }
}

/// Reads `body`, counted in `held` as it arrives: refused before reading
/// when its `Content-Length` is over the bound, and as soon as what
/// arrives passes a bound or pauses for `idle`.
pub async fn read(
    headers: &HeaderMap,
    mut body: Body,
    held: &mut Held,
    idle: Duration,
) -> Result<Bytes, ApiError> {
    let mut declared = 0;
    if let Some(length) = headers.get(header::CONTENT_LENGTH) {
        let length = length
            .to_str()
            .ok()
            .and_then(|l| l.parse::<u64>().ok())
            .ok_or_else(|| ApiError::new(Kind::Invalid, "content-length: not a number"))?;
        if length > MAX_REQUEST_BYTES as u64 {
            return Err(too_large());
        }
        declared = length as usize;
    }
    // Grown as bytes arrive, not before.
    let mut all = Vec::with_capacity(declared.min(1 << 20));
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => {
                return Err(ApiError::new(
                    Kind::Invalid,
                    format!(
                        "the request body stopped arriving for {} ms",
                        idle.as_millis()
                    ),
                ));
            }
            Ok(None) => return Ok(Bytes::from(all)),
            Ok(Some(frame)) => frame.map_err(|e| {
                ApiError::new(
                    Kind::Invalid,
                    format!("the request body could not be read: {e}"),
                )
            })?,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if all.len() + data.len() > MAX_REQUEST_BYTES {
            return Err(too_large());
        }
        held.take(data.len())?;
        all.extend_from_slice(&data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sessions_bytes_and_all_bytes_are_bounded_until_dropped() {
        let inflight = Arc::new(InFlight::default());
        let mut a1 = inflight.hold("a");
        a1.take(MAX_SESSION_BYTES).unwrap();
        let mut a2 = inflight.hold("a");
        assert_eq!(a2.take(1).unwrap_err().kind, Kind::Busy);
        drop(a1);
        a2.take(MAX_SESSION_BYTES).unwrap();
        let mut others: Vec<Held> = (0..MAX_TOTAL_BYTES / MAX_SESSION_BYTES - 1)
            .map(|i| {
                let mut h = inflight.hold(&format!("s{i}"));
                h.take(MAX_SESSION_BYTES).unwrap();
                h
            })
            .collect();
        let mut late = inflight.hold("late");
        let refused = late.take(1).unwrap_err();
        assert!(
            refused.message.contains("retry shortly"),
            "{}",
            refused.message
        );
        others.clear();
        drop(a2);
        late.take(1).unwrap();
        drop(late);
        let counts = inflight.counts.lock().unwrap();
        assert_eq!((counts.total, counts.sessions.len()), (0, 0));
    }
}
