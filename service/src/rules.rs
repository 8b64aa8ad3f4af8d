//! The limits the rules enforce, one set for every service on a database.
//!
//! Replicas behind one balancer must refuse the same calls, so the limits
//! (spawn limits and message limits, `--max-children` and the rest) live in
//! the database, under the shared setting `limits`, as the operator token
//! does. At start a service offers its own ([`settle`]): the first on a
//! database stores them; a later one whose limits differ refuses to start,
//! naming each flag with both values, unless it was started with
//! `--adopt-limits`, which stores its own in their place. A SQLite service
//! is alone on its database, so its own always win. While it runs a
//! service reads the stored limits every second ([`follow`]): a replica
//! started with `--adopt-limits` changes them for all.
//!
//! The handle ([`Rules`]) is what the handlers read at each call.

use std::{
    sync::{Arc, RwLock},
    time::Duration,
};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::store::Store;
use troupe_domain::limits::{Limits, MessageLimits};

/// The name of the shared setting that holds the limits.
pub const SETTING: &str = "limits";
/// How often a running service reads the stored limits.
pub const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// One set of limits: every flag of [`Limits`] and [`MessageLimits`],
/// stored as one JSON object keyed by the flags' names (`max_children`
/// for `--max-children`). A limit a stored set lacks (stored by an older
/// service) reads as its default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LimitSet {
    #[serde(flatten)]
    pub limits: Limits,
    #[serde(flatten)]
    pub messaging: MessageLimits,
}

impl LimitSet {
    /// The flags whose values differ between `self` (this service's) and
    /// `stored`, each with both values: `--max-children 3 (here) against 20
    /// (the database)`.
    pub fn differences(&self, stored: &LimitSet) -> Vec<String> {
        let (ours, theirs) = (as_object(self), as_object(stored));
        ours.iter()
            .filter(|(name, value)| theirs.get(*name) != Some(*value))
            .map(|(name, value)| {
                let stored = theirs
                    .get(name)
                    .map_or("none".to_owned(), |v| v.to_string());
                format!(
                    "--{} {value} (here) against {stored} (the database)",
                    name.replace('_', "-")
                )
            })
            .collect()
    }
}

fn as_object(set: &LimitSet) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::to_value(set) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    }
}

/// The limits in force, shared by the handlers and [`follow`].
#[derive(Clone, Debug)]
pub struct Rules(Arc<RwLock<LimitSet>>);

impl Rules {
    /// A handle on `set` (kept as it is unless [`follow`] runs).
    pub fn new(set: LimitSet) -> Rules {
        Rules(Arc::new(RwLock::new(set)))
    }

    /// The limits in force now.
    pub fn current(&self) -> LimitSet {
        *self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn limits(&self) -> Limits {
        self.current().limits
    }

    pub fn messaging(&self) -> MessageLimits {
        self.current().messaging
    }

    fn replace(&self, set: LimitSet) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = set;
    }
}

/// Settles this service's limits (`ours`) with the database's: stores them
/// if it holds none or with `adopt`, and fails, naming every flag that
/// differs, if it holds others. Returns the handle of the limits in force.
pub async fn settle(store: &impl Store, ours: LimitSet, adopt: bool) -> anyhow::Result<Rules> {
    let offered = serde_json::to_string(&ours).context("cannot write the limits")?;
    let stored = store
        .claim_setting(SETTING, &offered, adopt)
        .await
        .context("cannot read or store the limits in the database")?;
    let stored: LimitSet = serde_json::from_str(&stored)
        .context("the limits stored in the database are unreadable")?;
    let differences = ours.differences(&stored);
    anyhow::ensure!(
        differences.is_empty(),
        "this service's limits differ from those the services on this database enforce: {}; \
         start it with the database's, or with --adopt-limits to enforce its own on every \
         service of the database",
        differences.join(", ")
    );
    Ok(Rules::new(stored))
}

/// Reads the stored limits every [`FOLLOW_EVERY`] until `cancel`, and puts
/// what changed in force (logged). A failed read keeps the limits in force.
pub async fn follow(store: impl Store, rules: Rules, cancel: CancellationToken) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(FOLLOW_EVERY) => {}
        }
        let stored = match store.setting(SETTING).await {
            Ok(Some(text)) => serde_json::from_str::<LimitSet>(&text),
            Ok(None) | Err(_) => continue,
        };
        match stored {
            Ok(set) if set != rules.current() => {
                let changed = set.differences(&rules.current());
                tracing::info!(changes = %changed.join(", "), "limits changed in the database");
                rules.replace(set);
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "the limits stored in the database are unreadable")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_difference_names_the_flag_and_both_values() {
        let stored = LimitSet::default();
        let mut ours = stored;
        ours.limits.max_children = 3;
        ours.messaging.max_unread_bytes = 1 << 20;
        let differences = ours.differences(&stored);
        assert_eq!(
            differences,
            vec![
                "--max-children 3 (here) against 10 (the database)".to_owned(),
                "--max-unread-bytes 1048576 (here) against 8388608 (the database)".to_owned(),
            ]
        );
        assert!(stored.differences(&stored).is_empty());
    }

    #[test]
    fn a_limit_an_older_service_did_not_store_reads_as_its_default() {
        let set: LimitSet = serde_json::from_str(r#"{"max_children": 4}"#).expect("a set");
        assert_eq!(set.limits.max_children, 4);
        assert_eq!(set.messaging, MessageLimits::default());
    }
}
