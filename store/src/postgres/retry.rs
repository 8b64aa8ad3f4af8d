//! `retrying!`: a whole transaction run again when it lost a deadlock or a
//! serialization check.

use crate::error::{SessionError, StorageKind};

/// Times a transaction that lost a deadlock or a serialization check is
/// run again before its error is returned.
pub(crate) const RETRIES: u32 = 5;

/// Whether an error is a lost deadlock (40P01) or serialization check
/// (40001), which `troupe_domain::error::classify` takes for a conflict: the transaction
/// was rolled back and may simply run again.
pub(crate) fn retryable(error: &SessionError) -> bool {
    matches!(error, SessionError::Storage(e) if e.kind == StorageKind::Conflict)
}

/// Runs `$attempt` (an expression making one whole transaction's future)
/// until it does not fail with a [`retryable`] error, at most [`RETRIES`]
/// more times, with a short, growing pause between attempts.
macro_rules! retrying {
    ($attempt:expr) => {{
        let mut tries = 0u32;
        loop {
            match $attempt.await {
                Err(e)
                    if $crate::postgres::retry::retryable(&e)
                        && tries < $crate::postgres::retry::RETRIES =>
                {
                    tries += 1;
                    $crate::postgres::retry::pause(tries, &e).await;
                }
                result => break result,
            }
        }
    }};
}
pub(crate) use retrying;

/// The pause before running a transaction again.
pub(crate) async fn pause(tries: u32, error: &SessionError) {
    tracing::debug!(error = %error, tries, "transaction lost a lock conflict; running it again");
    let jitter = u64::from(rand::random::<u8>() % 10);
    tokio::time::sleep(std::time::Duration::from_millis(
        u64::from(tries) * 5 + jitter,
    ))
    .await;
}
