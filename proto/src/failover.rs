//! Several endpoints of one service (session-service replicas on one
//! database), as clients use them: a call goes to the endpoint that answered
//! last and, when that one cannot be reached, on to the next, each endpoint
//! once per call (a lone endpoint twice). Any answer, a refusal included, is
//! final.
//!
//! Callers pass only calls that are safe to repeat: reads, watches (reopened
//! after their last cursor), and writes that carry a `request_id` (so that a
//! write one replica committed before it went away is replayed by the next,
//! not done twice) or that are idempotent by rule (a termination).

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use tonic::{Code, Status, transport::Channel};

/// Splits an endpoint list, `a,b,...` (flags may also be repeated: each
/// value is split), into its endpoints; an empty entry is an error.
pub fn parse_list<S: AsRef<str>>(values: &[S]) -> Result<Vec<String>, String> {
    let mut endpoints = Vec::new();
    for value in values {
        for entry in value.as_ref().split(',') {
            let entry = entry.trim();
            if entry.is_empty() {
                return Err(format!(
                    "empty endpoint in {:?}: give endpoints separated by commas",
                    value.as_ref()
                ));
            }
            endpoints.push(entry.to_owned());
        }
    }
    if endpoints.is_empty() {
        return Err("no endpoint given".to_owned());
    }
    Ok(endpoints)
}

/// Whether a call failed because its endpoint could not be reached: the
/// connection was refused, or the server is draining (UNAVAILABLE: the
/// session service answers UNAVAILABLE for nothing else), or the connection
/// was lost while the call waited for its answer (its server killed), which
/// tonic reports as UNKNOWN with the transport's error as its source.
pub fn is_unreachable(status: &Status) -> bool {
    match status.code() {
        Code::Unavailable => true,
        Code::Unknown => std::error::Error::source(status)
            .is_some_and(|source| source.is::<tonic::transport::Error>()),
        _ => false,
    }
}

/// Returns a fresh request id (128 random bits, in hex) for a write that
/// may be repeated on another endpoint.
pub fn fresh_request_id() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// The pause before a lone endpoint is tried again.
pub const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// How long connecting to one endpoint may take before the next is tried.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A client `C` per endpoint, and which endpoint answered last.
pub struct Endpoints<C> {
    targets: Vec<(String, C)>,
    preferred: AtomicUsize,
}

impl<C: Clone> Endpoints<C> {
    /// A client per endpoint (`http://...` or `unix:///...`), made by `make`
    /// from a channel that connects on first use (within [`CONNECT_TIMEOUT`]).
    pub fn new(endpoints: &[String], make: impl Fn(Channel) -> C) -> anyhow::Result<Self> {
        anyhow::ensure!(!endpoints.is_empty(), "no endpoint given");
        let targets = endpoints
            .iter()
            .map(|text| {
                Ok((
                    text.clone(),
                    make(crate::endpoint::connect_lazy_within(text, CONNECT_TIMEOUT)?),
                ))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Endpoints {
            targets,
            preferred: AtomicUsize::new(0),
        })
    }

    /// The endpoints, as given, separated by commas.
    pub fn list(&self) -> String {
        let texts: Vec<&str> = self.targets.iter().map(|(text, _)| text.as_str()).collect();
        texts.join(",")
    }

    /// The endpoint calls go to first.
    pub fn preferred(&self) -> &str {
        &self.targets[self.preferred.load(Ordering::Relaxed) % self.targets.len()].0
    }

    /// Makes the next endpoint the first one tried: for a stream of the
    /// preferred one that broke (its server stops), so that it resumes on
    /// another.
    pub fn move_on(&self) {
        let next = (self.preferred.load(Ordering::Relaxed) + 1) % self.targets.len();
        self.preferred.store(next, Ordering::Relaxed);
    }

    /// Calls `rpc` with `message` on the preferred endpoint, then on each
    /// other one while the endpoint tried could not be reached
    /// ([`is_unreachable`]). Returns the first answer; if no endpoint could be
    /// reached, the failure (with several endpoints, one UNAVAILABLE naming
    /// each one's).
    pub async fn call<M, R, F, Fut>(&self, message: &M, rpc: F) -> Result<R, Status>
    where
        M: Clone,
        F: Fn(C, M) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let count = self.targets.len();
        let first = self.preferred.load(Ordering::Relaxed) % count;
        let mut failures = Vec::new();
        // One endpoint (a load balancer's, or the runner's relay) is tried
        // twice: a new connection there may reach another replica.
        for step in 0..count.max(2) {
            if step >= count {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            let index = (first + step) % count;
            let (text, client) = &self.targets[index];
            match rpc(client.clone(), message.clone()).await {
                Err(status) if is_unreachable(&status) => {
                    tracing::debug!(endpoint = %text, error = %status.message(), "endpoint unreachable");
                    failures.push((text, status));
                }
                answer => {
                    self.preferred.store(index, Ordering::Relaxed);
                    return answer.map(tonic::Response::into_inner);
                }
            }
        }
        if count == 1 {
            return Err(failures.pop().expect("a failure").1);
        }
        let each: Vec<String> = failures
            .iter()
            .map(|(text, status)| format!("{text}: {}", status.message()))
            .collect();
        Err(Status::unavailable(format!(
            "no endpoint could be reached ({})",
            each.join("; ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_is_split_on_commas_and_repeated_values() {
        assert_eq!(
            parse_list(&["http://a:1, http://b:2", "unix:///s"]).unwrap(),
            ["http://a:1", "http://b:2", "unix:///s"]
        );
    }

    #[test]
    fn an_empty_entry_is_refused() {
        let err = parse_list(&["http://a:1,,http://b:2"]).unwrap_err();
        assert!(err.contains("empty endpoint"), "{err}");
        assert!(parse_list::<&str>(&[]).is_err());
    }
}
