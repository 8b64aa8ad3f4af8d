//! Write scopes: the directories under `/workspace` a session's agent may
//! write, enforced in its container by Landlock (see the runner's `scope`
//! module). An empty scope is no limit: the whole workspace. A child's scope
//! is never wider than its parent's. A sandboxed session given no scope
//! writes only in [`SANDBOXED_AREA`], so that nothing a direct agent reads
//! or runs elsewhere in the workspace was written by a sandboxed one.
//!
//! [`WritablePath`] (absolute, under `/workspace`, normalised, no `..`) and
//! [`WriteScope`] (its paths) with [`WriteScope::narrows_to`] are the one
//! containment rule: the session service's policy, the runner's checks, the
//! CLI and the MCP bridge all parse scopes through them.

use std::fmt;

/// Where every scope lies.
pub const WORKSPACE: &str = "/workspace";
/// Where a sandboxed session given no write scope writes: the workspace's
/// area for sandboxed work, made by the runner in every workspace.
pub const SANDBOXED_AREA: &str = "/workspace/sandboxed";
/// The area's directory name, in the workspace's directory.
pub const SANDBOXED_AREA_DIR: &str = "sandboxed";
/// Most paths one scope may name.
pub const MAX_PATHS: usize = 16;
/// Longest path, in bytes.
pub const MAX_PATH_LEN: usize = 1024;

/// One directory an agent may write under, normalised: absolute, inside
/// `/workspace` (or `/workspace` itself), without `.`, `..`, empty
/// components or a trailing slash.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WritablePath(String);

impl WritablePath {
    /// Parses and normalises `raw`, or says why it is not a writable path.
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.len() > MAX_PATH_LEN {
            return Err(format!("writable path is longer than {MAX_PATH_LEN} bytes"));
        }
        if raw.contains('\0') {
            return Err(format!("writable path {raw:?} contains NUL"));
        }
        if !raw.starts_with('/') {
            return Err(format!(
                "writable path {raw:?} must be absolute, under {WORKSPACE}"
            ));
        }
        let mut parts = Vec::new();
        for part in raw.split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    return Err(format!("writable path {raw:?} must not contain '..'"));
                }
                part => parts.push(part),
            }
        }
        let path = format!("/{}", parts.join("/"));
        if !is_within(&path, WORKSPACE) {
            return Err(format!("writable path {raw:?} is outside {WORKSPACE}"));
        }
        Ok(Self(path))
    }

    /// The path, normalised.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `other` is this directory or lies under it.
    pub fn contains(&self, other: &WritablePath) -> bool {
        is_within(&other.0, &self.0)
    }
}

impl fmt::Display for WritablePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `path` is `dir` or under it (both normalised).
fn is_within(path: &str, dir: &str) -> bool {
    path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// A session's write scope: the directories its agent may write under,
/// or, empty, the whole workspace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteScope(Vec<WritablePath>);

impl WriteScope {
    /// The scope of no limit.
    pub fn unscoped() -> Self {
        Self::default()
    }

    /// The scope of a sandboxed session given none: [`SANDBOXED_AREA`].
    pub fn sandboxed_area() -> Self {
        Self(vec![WritablePath(SANDBOXED_AREA.to_owned())])
    }

    /// Parses a request's paths: each as [`WritablePath::parse`], at most
    /// [`MAX_PATHS`], duplicates and paths inside another dropped, sorted.
    pub fn parse<S: AsRef<str>>(raw: &[S]) -> Result<Self, String> {
        if raw.len() > MAX_PATHS {
            return Err(format!(
                "at most {MAX_PATHS} writable paths may be given, not {}",
                raw.len()
            ));
        }
        let mut paths = raw
            .iter()
            .map(|p| WritablePath::parse(p.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        paths.sort();
        paths.dedup();
        let covered: Vec<bool> = paths
            .iter()
            .map(|p| paths.iter().any(|q| q != p && q.contains(p)))
            .collect();
        let mut flags = covered.into_iter();
        paths.retain(|_| !flags.next().unwrap_or(false));
        Ok(Self(paths))
    }

    /// Whether the scope limits nothing (the whole workspace).
    pub fn is_unscoped(&self) -> bool {
        self.0.is_empty()
    }

    /// The directories, normalised (none when unscoped).
    pub fn paths(&self) -> &[WritablePath] {
        &self.0
    }

    /// The paths as strings, for the wire and the database.
    pub fn to_strings(&self) -> Vec<String> {
        self.0.iter().map(|p| p.0.clone()).collect()
    }

    /// Whether `path` may be written under this scope.
    pub fn allows(&self, path: &WritablePath) -> bool {
        self.is_unscoped() || self.0.iter().any(|dir| dir.contains(path))
    }

    /// Checks that `child` is no wider than this scope: every path of the
    /// child lies inside one of this scope's, and an unscoped child only
    /// under an unscoped parent. Returns the first path that is not.
    pub fn narrows_to(&self, child: &WriteScope) -> Result<(), String> {
        if self.is_unscoped() {
            return Ok(());
        }
        if child.is_unscoped() {
            return Err(format!(
                "the whole workspace is wider than the parent's write scope ({self})"
            ));
        }
        match child.0.iter().find(|p| !self.allows(p)) {
            None => Ok(()),
            Some(p) => Err(format!(
                "writable path {p} is outside the parent's write scope ({self})"
            )),
        }
    }
}

impl fmt::Display for WriteScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_unscoped() {
            return f.write_str(WORKSPACE);
        }
        f.write_str(&self.to_strings().join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised_or_refused() {
        let ok = |raw: &str, want: &str| {
            assert_eq!(WritablePath::parse(raw).unwrap().as_str(), want, "{raw}")
        };
        ok("/workspace", "/workspace");
        ok("/workspace/", "/workspace");
        ok("//workspace//src/./a/", "/workspace/src/a");
        for bad in [
            "workspace/src",
            "",
            "/",
            "/workspacefoo",
            "/etc",
            "/workspace/../etc",
            "/workspace/src/..",
            "/workspace/a\0b",
        ] {
            assert!(WritablePath::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(WritablePath::parse(&format!("/workspace/{}", "a".repeat(MAX_PATH_LEN))).is_err());
    }

    #[test]
    fn scopes_drop_covered_paths_and_limit_their_size() {
        let scope = WriteScope::parse(&[
            "/workspace/src/a",
            "/workspace/src",
            "/workspace/doc",
            "/workspace/src",
        ])
        .unwrap();
        assert_eq!(scope.to_strings(), ["/workspace/doc", "/workspace/src"]);
        let many: Vec<String> = (0..=MAX_PATHS).map(|i| format!("/workspace/{i}")).collect();
        assert!(WriteScope::parse(&many).is_err());
        assert!(WriteScope::parse::<&str>(&[]).unwrap().is_unscoped());
    }

    #[test]
    fn a_child_scope_only_narrows() {
        let scope = |p: &[&str]| WriteScope::parse(p).unwrap();
        let parent = scope(&["/workspace/src", "/workspace/doc"]);
        // (parent, child, allowed)
        let table: &[(&WriteScope, WriteScope, bool)] = &[
            (&parent, scope(&["/workspace/src"]), true),
            (
                &parent,
                scope(&["/workspace/src/a", "/workspace/doc"]),
                true,
            ),
            (
                &parent,
                scope(&["/workspace/src", "/workspace/tests"]),
                false,
            ),
            (&parent, scope(&["/workspace"]), false),
            (&parent, scope(&["/workspace/srcx"]), false),
            (&parent, WriteScope::unscoped(), false),
            (&WriteScope::unscoped(), scope(&["/workspace"]), true),
            (&WriteScope::unscoped(), WriteScope::unscoped(), true),
        ];
        for (parent, child, allowed) in table {
            assert_eq!(
                parent.narrows_to(child).is_ok(),
                *allowed,
                "{parent} -> {child}"
            );
        }
    }
}
