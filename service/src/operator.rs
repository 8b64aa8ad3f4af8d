//! The operator token, shared by every service on one database: the
//! database is its home. At start a service offers its own (configured,
//! else its `<data-dir>/operator.token`, else a new one) and the store keeps
//! the first it was offered ([`CatalogStore::claim_operator_token`](crate::store::CatalogStore::claim_operator_token)): the first
//! service to start on a database wins. A configured token that differs
//! from the stored one stops the service; a file or generated one gives way
//! to the stored one, which is then written to the file for the local CLI.
//!
//! The token itself appears in no log and no error.

use std::path::Path;

use anyhow::Context;
use troupe_proto::paths;

use crate::{model::OperatorToken, store::Store};

/// Where a service's own operator token came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `--operator-token` or `TROUPE_OPERATOR_TOKEN`.
    Configured,
    /// `<data-dir>/operator.token`.
    File,
    /// Made at this start: there was neither.
    Generated,
}

/// Returns the operator token of the database, storing this service's own
/// if it holds none; fails if a configured token is not the stored one.
pub async fn settle(
    store: &impl Store,
    configured: Option<&str>,
    data_dir: &Path,
) -> anyhow::Result<OperatorToken> {
    let (own, origin) = own_token(configured, data_dir)?;
    let stored = store
        .claim_operator_token(&own)
        .await
        .context("cannot read or store the operator token in the database")?;
    match origin {
        Origin::Configured if stored != own => anyhow::bail!(
            "the configured operator token (--operator-token or TROUPE_OPERATOR_TOKEN) is not \
             the one this database holds, which the first service to start on it stored: \
             configure that one, or none to have this service use it"
        ),
        Origin::Configured => {}
        Origin::File if stored == own => {}
        Origin::File | Origin::Generated => {
            paths::write_operator_token(data_dir, stored.expose())?;
            let path = paths::operator_token_path(data_dir);
            if origin == Origin::File {
                tracing::warn!(
                    path = %path.display(),
                    "the operator token file held another token than the database's; \
                     it now holds the database's"
                );
            } else {
                tracing::info!(path = %path.display(), "operator token written");
            }
        }
    }
    Ok(stored)
}

/// This service's own token and where it came from. A generated one is not
/// written anywhere yet: the database's is, once settled.
fn own_token(configured: Option<&str>, data_dir: &Path) -> anyhow::Result<(OperatorToken, Origin)> {
    let (text, origin) = match configured {
        Some(token) => (paths::configured_operator_token(token)?, Origin::Configured),
        None => match paths::read_operator_token(data_dir)? {
            Some(token) => (token, Origin::File),
            None => (paths::generate_operator_token(), Origin::Generated),
        },
    };
    let path = paths::operator_token_path(data_dir);
    let token = OperatorToken::new(&text).with_context(|| {
        format!(
            "the operator token in {} is shorter than {} characters: remove the file to have \
             one generated",
            path.display(),
            OperatorToken::MIN_LEN
        )
    })?;
    Ok((token, origin))
}
