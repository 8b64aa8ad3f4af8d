//! Who is calling. Session tokens are JWTs (HS256) minted here, with a key
//! id, an expiry and the session id as subject; their signing keys live in
//! the database so a restart keeps every live token valid. The operator
//! token is an opaque secret compared in constant time.
//!
//! A verified token only names a session: the caller's workspace, trust,
//! tree and depth are read from that session's row, and a token of a
//! session that has ended is refused.

use std::{
    collections::HashMap,
    sync::RwLock,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation, errors::ErrorKind};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;
use tonic::metadata::MetadataMap;

use crate::{
    error::{Reason, SessionError},
    model::{OperatorToken, SessionId},
    store::Store,
};

const ISSUER: &str = "troupe";
const AUDIENCE: &str = "troupe.session.v1";

/// Claims of a session token.
#[derive(Debug, Serialize, Deserialize)]
pub struct Claims {
    /// The session the token is bound to.
    pub sub: SessionId,
    pub iss: String,
    pub aud: String,
    pub iat: u64,
    pub exp: u64,
    /// Token id, for the audit log.
    pub jti: String,
}

/// What a bearer token turned out to be.
#[derive(Debug)]
pub enum Bearer {
    Operator,
    Session(Claims),
}

/// Mints and verifies tokens.
pub struct Tokens {
    operator: OperatorToken,
    ttl: Duration,
    /// kid of the key that signs new tokens.
    current: String,
    keys: RwLock<HashMap<String, Vec<u8>>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("current", &self.current)
            .finish_non_exhaustive()
    }
}

impl Tokens {
    /// Loads the signing keys from the store, creating the first one if there is none.
    pub async fn load(
        store: &impl Store,
        operator: OperatorToken,
        ttl: Duration,
    ) -> Result<Self, SessionError> {
        let mut keys = store.signing_keys().await?;
        if keys.is_empty() {
            let mut secret = vec![0u8; 32];
            rand::rng().fill_bytes(&mut secret);
            let kid = format!("k{}", uuid::Uuid::now_v7().simple());
            store.add_signing_key(&kid, &secret).await?;
            keys = store.signing_keys().await?;
        }
        let current = keys[0].0.clone();
        Ok(Tokens {
            operator,
            ttl,
            current,
            keys: RwLock::new(keys.into_iter().collect()),
        })
    }

    /// The operator token, for calls to the runner.
    pub fn operator(&self) -> &str {
        self.operator.expose()
    }

    /// Mints a token bound to `session_id`; returns it and its expiry (Unix seconds).
    pub fn mint(&self, session_id: &SessionId) -> Result<(String, u64), SessionError> {
        let iat = unix_now();
        let exp = iat + self.ttl.as_secs().max(1);
        let claims = Claims {
            sub: session_id.clone(),
            iss: ISSUER.to_owned(),
            aud: AUDIENCE.to_owned(),
            iat,
            exp,
            jti: uuid::Uuid::new_v4().simple().to_string(),
        };
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some(self.current.clone());
        let keys = self
            .keys
            .read()
            .map_err(|_| SessionError::Internal("key lock".into()))?;
        let secret = keys
            .get(&self.current)
            .ok_or_else(|| SessionError::Internal("signing key missing".into()))?;
        let token = jsonwebtoken::encode(&header, &claims, &EncodingKey::from_secret(secret))
            .map_err(|e| SessionError::Internal(format!("token signing failed: {e}")))?;
        Ok((token, exp))
    }

    /// Classifies and verifies a bearer token. Session tokens signed by a key
    /// this process has not seen yet are checked against the store's keys.
    pub async fn verify(&self, token: &str, store: &impl Store) -> Result<Bearer, SessionError> {
        if bool::from(token.as_bytes().ct_eq(self.operator.expose().as_bytes())) {
            return Ok(Bearer::Operator);
        }
        let invalid = || SessionError::refused(Reason::TokenInvalid, "invalid session token");
        let header = jsonwebtoken::decode_header(token).map_err(|_| invalid())?;
        let kid = header.kid.ok_or_else(invalid)?;
        if header.alg != Algorithm::HS256 {
            return Err(invalid());
        }
        let mut secret = self.key(&kid)?;
        if secret.is_none() {
            let fresh = store.signing_keys().await?;
            let mut keys = self
                .keys
                .write()
                .map_err(|_| SessionError::Internal("key lock".into()))?;
            keys.extend(fresh);
            secret = keys.get(&kid).cloned();
        }
        let secret = secret.ok_or_else(invalid)?;
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 0;
        validation.set_issuer(&[ISSUER]);
        validation.set_audience(&[AUDIENCE]);
        validation.set_required_spec_claims(&["exp", "sub", "iss", "aud"]);
        match jsonwebtoken::decode::<Claims>(token, &DecodingKey::from_secret(&secret), &validation)
        {
            Ok(data) => Ok(Bearer::Session(data.claims)),
            Err(e) if matches!(e.kind(), ErrorKind::ExpiredSignature) => Err(
                SessionError::refused(Reason::TokenExpired, "session token expired"),
            ),
            Err(_) => Err(invalid()),
        }
    }

    fn key(&self, kid: &str) -> Result<Option<Vec<u8>>, SessionError> {
        let keys = self
            .keys
            .read()
            .map_err(|_| SessionError::Internal("key lock".into()))?;
        Ok(keys.get(kid).cloned())
    }
}

/// Returns the bearer token of a request, or `TOKEN_MISSING`.
pub fn bearer(metadata: &MetadataMap) -> Result<&str, SessionError> {
    let missing = || {
        SessionError::refused(
            Reason::TokenMissing,
            "missing credentials: send `authorization: Bearer <token>`",
        )
    };
    let value = metadata.get("authorization").ok_or_else(missing)?;
    let value = value.to_str().map_err(|_| missing())?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .ok_or_else(missing)?
        .trim();
    if token.is_empty() {
        return Err(missing());
    }
    Ok(token)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
