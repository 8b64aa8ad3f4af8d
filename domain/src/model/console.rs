//! The web console's sign-ins (the service's `console`): the secret a browser
//! holds, and what the store keeps of it.

use super::{ProgressReport, SessionId};
use std::fmt;

use base64::Engine as _;
use rand::RngCore as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Random bytes in a console session's id and in its CSRF token.
const SECRET_BYTES: usize = 32;

/// The id a browser holds in its console cookie: a secret. Its `Debug`
/// names no character of it; the store keeps only its [`hash`](Self::hash).
#[derive(Clone)]
pub struct ConsoleSessionId(String);

impl ConsoleSessionId {
    /// A new random id.
    pub fn generate() -> Self {
        ConsoleSessionId(random_text())
    }

    /// Wraps an id as a cookie carried it; `None` unless it has the form
    /// [`generate`](Self::generate) gives (so no other text reaches the store).
    pub fn parse(text: &str) -> Option<Self> {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text)
            .ok()?;
        (bytes.len() == SECRET_BYTES).then(|| ConsoleSessionId(text.to_owned()))
    }

    /// The cookie's value.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// What the store keys the session by: the id's SHA-256, in hex.
    pub fn hash(&self) -> String {
        hex::encode(Sha256::digest(self.0.as_bytes()))
    }
}

impl fmt::Debug for ConsoleSessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ConsoleSessionId(..)")
    }
}

/// A console session's CSRF token: given to the page in a JSON answer,
/// required in a header of each of its state-changing requests.
#[derive(Clone, PartialEq, Eq)]
pub struct CsrfToken(String);

impl CsrfToken {
    pub fn generate() -> Self {
        CsrfToken(random_text())
    }

    /// Wraps a stored token.
    pub fn from_stored(text: String) -> Self {
        CsrfToken(text)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `presented` (a request's header) is this token, compared in
    /// constant time.
    pub fn matches(&self, presented: &str) -> bool {
        self.0.as_bytes().ct_eq(presented.as_bytes()).into()
    }
}

impl fmt::Debug for CsrfToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CsrfToken(..)")
    }
}

/// A console session as the store keeps it.
#[derive(Clone, Debug)]
pub struct ConsoleSession {
    /// [`ConsoleSessionId::hash`] of its id.
    pub id_hash: String,
    pub csrf: CsrfToken,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
}

/// A message to or from a session, body included: what the console's
/// session view shows of its inbox and of what it sent.
#[derive(Clone, Debug)]
pub struct MessageRecord {
    pub message_id: String,
    /// The recipient.
    pub session_id: SessionId,
    /// Its place in the recipient's inbox.
    pub seq: u64,
    pub sender: super::Principal,
    pub body: String,
    pub created_at_ms: i64,
    /// When it was written to the recipient's agent; `None` while unread.
    pub delivered_at_ms: Option<i64>,
}

/// A session's last progress report (`ReportProgress`).
/// What a tree's node shows of a session beyond its row: its inbox and its
/// last progress report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionActivity {
    pub session_id: SessionId,
    /// Messages stored in its inbox (its last inbox sequence).
    pub received: u64,
    /// Every inbox message up to this sequence was handed to its agent
    /// (`ProcessStore::mark_delivered`, which also sets their `delivered_at_ms`).
    pub delivered_through: u64,
    pub progress: Option<ProgressReport>,
}

impl SessionActivity {
    /// Messages received and not yet handed to its agent.
    pub fn unread(&self) -> u64 {
        self.received.saturating_sub(self.delivered_through)
    }
}

fn random_text() -> String {
    let mut bytes = [0u8; SECRET_BYTES];
    rand::rng().fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_only_in_their_own_form_and_never_print() {
        let id = ConsoleSessionId::generate();
        assert!(ConsoleSessionId::parse(id.expose()).is_some());
        assert!(ConsoleSessionId::parse("short").is_none());
        assert!(ConsoleSessionId::parse(&format!("{}A", id.expose())).is_none());
        assert!(!format!("{id:?}").contains(id.expose()));
        assert_ne!(id.hash(), id.expose());
        let csrf = CsrfToken::generate();
        assert!(csrf.matches(csrf.expose()));
        assert!(!csrf.matches(&CsrfToken::generate().0));
        assert!(!format!("{csrf:?}").contains(csrf.expose()));
    }
}
