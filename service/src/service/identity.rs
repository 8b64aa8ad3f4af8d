//! Who a call is made by, for as long as the call lasts.
//!
//! [`identify`] establishes the caller from the bearer token and the
//! database: the one place it is done. A call that lasts (a watch, a `sync`
//! create waiting on its child) also holds a [`Lapse`], which completes with
//! the refusal a new call with the same token would get, as soon as it would
//! get one: when the caller's session ends (its tokens are revoked) or the
//! token expires. The call then ends with that refusal.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::Inner;
use crate::{
    auth::Bearer,
    error::{Reason, SessionError},
    model::{Caller, SessionId},
    store::Store,
};

/// Establishes the caller of `token`, and when the token expires (Unix
/// seconds; none for the operator).
pub async fn identify<S: Store>(
    inner: &Inner<S>,
    token: &str,
) -> Result<(Caller, Option<u64>), SessionError> {
    identify_as(inner, token, false).await
}

/// [`identify`], except that a valid token of a session that has ended
/// names it all the same: for `FinishSession` alone, whose store write
/// refuses an ended session (FAILED_PRECONDITION, "finished already")
/// rather than leaving the agent to guess why its token was refused.
pub async fn identify_finishing<S: Store>(
    inner: &Inner<S>,
    token: &str,
) -> Result<(Caller, Option<u64>), SessionError> {
    identify_as(inner, token, true).await
}

async fn identify_as<S: Store>(
    inner: &Inner<S>,
    token: &str,
    ended_too: bool,
) -> Result<(Caller, Option<u64>), SessionError> {
    match inner.tokens.verify(token, &inner.store).await? {
        Bearer::Operator => Ok((Caller::Operator, None)),
        Bearer::Session(claims) => {
            let row = inner.store.get_session(&claims.sub).await?.ok_or_else(|| {
                SessionError::refused(Reason::TokenInvalid, "invalid session token")
            })?;
            if !row.is_active() && !ended_too {
                return Err(SessionError::refused(
                    Reason::TokenRevoked,
                    format!(
                        "session {} has ended ({}); its tokens are revoked",
                        row.session_id,
                        troupe_proto::status::status_str(row.status)
                    ),
                ));
            }
            Ok((Caller::Session(Box::new(row)), Some(claims.exp)))
        }
    }
}

/// What a caller's standing rests on while its call lasts.
#[derive(Clone, Debug)]
pub enum Lapse {
    /// The operator token does not lapse while the service runs.
    Never,
    /// A session token: valid until it expires or its session ends.
    Session {
        token: String,
        session_id: SessionId,
        /// Unix seconds; the token is refused from the second after.
        expires_at: u64,
    },
}

impl Lapse {
    /// What the standing of `caller`, identified by `token` that expires
    /// at `expires_at`, rests on.
    pub fn of(caller: &Caller, token: &str, expires_at: Option<u64>) -> Lapse {
        match (caller, expires_at) {
            (Caller::Session(me), Some(expires_at)) => Lapse::Session {
                token: token.to_owned(),
                session_id: me.session_id.clone(),
                expires_at,
            },
            _ => Lapse::Never,
        }
    }

    /// The refusal a new call would get now, if it would get one. The
    /// ledger and the clock decide whether to look; the token is verified
    /// again only then, for the refusal's own words.
    pub async fn check<S: Store>(&self, inner: &Inner<S>) -> Result<(), SessionError> {
        match self {
            Lapse::Session { token, .. } if self.may_have_lapsed(inner).await => {
                identify(inner, token).await.map(|_| ())
            }
            _ => Ok(()),
        }
    }

    /// Completes, with the refusal a new call would get, once the caller's
    /// token would be refused; never for the operator.
    pub async fn lapsed<S: Store>(&self, inner: &Inner<S>) -> SessionError {
        let Lapse::Session { expires_at, .. } = self else {
            return std::future::pending().await;
        };
        // Subscribed before the first look, so no ending falls between.
        let mut ends = inner.store.subscribe_ends();
        loop {
            if let Err(refusal) = self.check(inner).await {
                return refusal;
            }
            let expiry = until_unix(expires_at + 1);
            tokio::select! {
                changed = ends.changed() => {
                    if changed.is_err() {
                        return std::future::pending().await;
                    }
                }
                () = tokio::time::sleep(expiry) => {}
            }
        }
    }

    /// Whether the caller's session has ended or its token expired, by the
    /// ledger and the clock alone.
    async fn may_have_lapsed<S: Store>(&self, inner: &Inner<S>) -> bool {
        let Lapse::Session {
            session_id,
            expires_at,
            ..
        } = self
        else {
            return false;
        };
        let ended = match inner.store.get_session(session_id).await {
            Ok(Some(row)) => !row.is_active(),
            Ok(None) | Err(_) => true,
        };
        ended || unix_now() > *expires_at
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The time from now until Unix second `at` (at least a few milliseconds,
/// so a clock at the boundary does not spin).
fn until_unix(at: u64) -> Duration {
    let at = UNIX_EPOCH + Duration::from_secs(at);
    at.duration_since(SystemTime::now())
        .unwrap_or_default()
        .max(Duration::from_millis(10))
}
