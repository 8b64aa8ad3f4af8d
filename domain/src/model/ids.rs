//! The ids of the spawn tree, each a type of its own: a session's, a tree's
//! and a workspace's. One cannot stand for another where a signature names
//! it; each reads as the text it is (`Deref<Target = str>`), which is how it
//! is stored (sqlx transparent), sent (serde transparent) and shown.
//!
//! An id becomes one of these where it enters: from a request (the
//! service's handlers), from a row (the store), or where it is made (a
//! session's by the service's create, a tree's by the store's root create).
//!
//! One kind of id is not taken where another is named:
//!
//! ```compile_fail
//! use troupe_domain::model::{SessionId, TreeId};
//! fn end(_: &SessionId) {}
//! end(&TreeId::from("tree_1"));
//! ```

use std::{borrow::Borrow, fmt, ops::Deref};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[derive(serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        #[cfg_attr(feature = "sqlx", derive(sqlx::Type), sqlx(transparent))]
        pub struct $name(String);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> $name {
                $name(id)
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> $name {
                $name(id.to_owned())
            }
        }

        impl From<&String> for $name {
            fn from(id: &String) -> $name {
                $name(id.clone())
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl From<&$name> for String {
            fn from(id: &$name) -> String {
                id.0.clone()
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                self == &other.0
            }
        }

        impl PartialEq<$name> for str {
            fn eq(&self, other: &$name) -> bool {
                self == other.0
            }
        }

        impl PartialEq<$name> for &str {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }
    };
}

id_type!(
    /// A session's id (`sess_` and a UUID).
    SessionId
);

id_type!(
    /// A spawn tree's id (`tree_` and a UUID).
    TreeId
);

id_type!(
    /// A workspace's id, as its creator named it.
    WorkspaceId
);

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn an_id_is_its_text_in_json() {
        let id = SessionId::from("sess_1");
        assert_eq!(serde_json::to_string(&id).unwrap(), r#""sess_1""#);
        assert_eq!(
            serde_json::from_str::<SessionId>(r#""sess_1""#).unwrap(),
            id
        );
        assert!(serde_json::from_str::<SessionId>("1").is_err());
    }

    #[test]
    fn a_map_of_ids_is_read_by_text() {
        let map = HashMap::from([(WorkspaceId::from("ws"), 1)]);
        assert_eq!(map.get("ws"), Some(&1));
        assert_eq!(map.get("other"), None);
    }
}
