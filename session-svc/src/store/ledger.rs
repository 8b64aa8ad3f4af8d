//! [`Ledger`]: the sessions table held in memory, so that reads (the caller's
//! row on every call, spawn quotas, lists, children) cost no round trip to
//! the database.
//!
//! The store owns its database alone (see [`super::SqliteStore::claim`]) and
//! changes the ledger only after a commit, under its writer lock, with the
//! rows it committed: the ledger is always a state the database was in, and
//! a reader never sees a row that was not committed. Every session ever
//! created is kept (under a kilobyte each, see BENCHMARKS.md), as the table
//! keeps them.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use crate::model::{SessionRow, Trust};

fn trust_index(trust: Trust) -> usize {
    match trust {
        Trust::Direct => 0,
        Trust::Sandboxed => 1,
    }
}

/// A session and its position in creation order (its rowid).
#[derive(Clone, Debug)]
struct Entry {
    rowid: i64,
    row: Arc<SessionRow>,
}

#[derive(Debug, Default)]
struct Workspace {
    /// Every session of the workspace, by rowid.
    sessions: BTreeMap<i64, Arc<SessionRow>>,
    /// How many of them are pending or running: direct, then sandboxed.
    active: [u32; 2],
}

/// The counts a spawn's quotas are checked against.
#[derive(Clone, Debug)]
pub(crate) struct SpawnFacts {
    pub parent: SessionRow,
    /// Sessions of the parent's tree, ended ones included.
    pub tree_sessions: u32,
    /// Children the parent ever created.
    pub children: u32,
    /// Pending or running sessions of the parent's workspace.
    pub workspace_active: u32,
}

/// The sessions table, in memory, with the indexes the reads need.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    sessions: HashMap<String, Entry>,
    workspaces: HashMap<String, Workspace>,
    /// Sessions per tree.
    trees: HashMap<String, u32>,
    /// Children of each session, by rowid.
    children: HashMap<String, Vec<(i64, String)>>,
    /// Sessions that ended since the ledger was loaded.
    ended: u64,
}

impl Ledger {
    /// Builds the ledger from every stored session, `(rowid, row)`.
    pub fn load(rows: impl IntoIterator<Item = (i64, SessionRow)>) -> Ledger {
        let mut ledger = Ledger::default();
        for (rowid, row) in rows {
            ledger.put(rowid, row);
        }
        ledger
    }

    /// Inserts a new session or replaces a stored one's row (its rowid,
    /// workspace, tree and parent never change).
    pub fn put(&mut self, rowid: i64, row: SessionRow) {
        let row = Arc::new(row);
        let workspace = self.workspaces.entry(row.workspace_id.clone()).or_default();
        let entry = Entry {
            rowid,
            row: row.clone(),
        };
        match self.sessions.insert(row.session_id.clone(), entry) {
            Some(old) => {
                workspace.active[trust_index(old.row.trust)] -= u32::from(old.row.is_active());
                self.ended += u64::from(old.row.is_active() && !row.is_active());
            }
            None => {
                *self.trees.entry(row.tree_id.clone()).or_default() += 1;
                if let Some(parent) = &row.parent_session_id {
                    let siblings = self.children.entry(parent.clone()).or_default();
                    let at = siblings.partition_point(|(r, _)| *r < rowid);
                    siblings.insert(at, (rowid, row.session_id.clone()));
                }
            }
        }
        workspace.active[trust_index(row.trust)] += u32::from(row.is_active());
        workspace.sessions.insert(rowid, row);
    }

    /// Changes a stored session's row in place; no-op for an unknown id.
    pub fn update(&mut self, session_id: &str, change: impl FnOnce(&mut SessionRow)) {
        if let Some(entry) = self.sessions.get(session_id) {
            let rowid = entry.rowid;
            let mut row = SessionRow::clone(&entry.row);
            change(&mut row);
            self.put(rowid, row);
        }
    }

    pub fn get(&self, session_id: &str) -> Option<SessionRow> {
        self.sessions
            .get(session_id)
            .map(|e| SessionRow::clone(&e.row))
    }

    pub fn spawn_facts(&self, parent_id: &str) -> Option<SpawnFacts> {
        let parent = self.sessions.get(parent_id)?;
        Some(SpawnFacts {
            tree_sessions: self.trees.get(&parent.row.tree_id).copied().unwrap_or(0),
            children: self.children.get(parent_id).map_or(0, |c| c.len() as u32),
            workspace_active: self.active_in_workspace(&parent.row.workspace_id),
            parent: SessionRow::clone(&parent.row),
        })
    }

    /// How many sessions have ended since the ledger was loaded.
    pub fn ended(&self) -> u64 {
        self.ended
    }

    pub fn active_in_workspace(&self, workspace_id: &str) -> u32 {
        self.workspaces
            .get(workspace_id)
            .map_or(0, |w| w.active.iter().sum())
    }

    /// Pending or running sessions by workspace and trust level (those
    /// with any).
    pub fn active_counts(&self) -> Vec<(String, Trust, u32)> {
        let mut counts = Vec::new();
        for (id, workspace) in &self.workspaces {
            for trust in [Trust::Direct, Trust::Sandboxed] {
                let n = workspace.active[trust_index(trust)];
                if n > 0 {
                    counts.push((id.clone(), trust, n));
                }
            }
        }
        counts
    }

    /// A session's direct children, oldest first.
    pub fn children(&self, session_id: &str) -> Vec<SessionRow> {
        self.children
            .get(session_id)
            .into_iter()
            .flatten()
            .filter_map(|(_, id)| self.get(id))
            .collect()
    }

    /// A session's ancestors, nearest first.
    pub fn ancestors(&self, session_id: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut at = self.sessions.get(session_id);
        while let Some(parent) = at.and_then(|e| e.row.parent_session_id.as_ref()) {
            out.push(parent.clone());
            at = self.sessions.get(parent);
        }
        out
    }

    /// The active sessions of the subtree rooted at `session_id`: the root
    /// first, then level by level, each level in creation order.
    pub fn active_subtree(&self, session_id: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut level: Vec<(i64, &str)> = match self.sessions.get_key_value(session_id) {
            Some((id, e)) => vec![(e.rowid, id.as_str())],
            None => return out,
        };
        while !level.is_empty() {
            level.sort_unstable();
            let mut next = Vec::new();
            for (_, id) in &level {
                if self.sessions[*id].row.is_active() {
                    out.push((*id).to_owned());
                }
                for (rowid, child) in self.children.get(*id).into_iter().flatten() {
                    next.push((*rowid, child.as_str()));
                }
            }
            level = next;
        }
        out
    }

    /// Lists a workspace's sessions after rowid `after`, at most `limit`;
    /// returns them and the next page token (the last rowid) if more follow.
    pub fn list(
        &self,
        workspace_id: &str,
        sandboxed_only: bool,
        include_ended: bool,
        after: i64,
        limit: u32,
    ) -> (Vec<Arc<SessionRow>>, Option<i64>) {
        let Some(workspace) = self.workspaces.get(workspace_id) else {
            return (Vec::new(), None);
        };
        let mut page = Vec::new();
        let mut last = after;
        let wanted = workspace
            .sessions
            .range(after.saturating_add(1)..)
            .filter(|(_, row)| {
                (!sandboxed_only || row.trust == crate::model::Trust::Sandboxed)
                    && (include_ended || row.is_active())
            });
        for (rowid, row) in wanted {
            if page.len() == limit as usize {
                return (page, Some(last));
            }
            last = *rowid;
            page.push(row.clone());
        }
        (page, None)
    }

    /// Every pending or running session, in creation order.
    pub fn active(&self) -> Vec<SessionRow> {
        let mut rows: Vec<_> = self
            .sessions
            .values()
            .filter(|e| e.row.is_active())
            .map(|e| (e.rowid, SessionRow::clone(&e.row)))
            .collect();
        rows.sort_unstable_by_key(|(rowid, _)| *rowid);
        rows.into_iter().map(|(_, row)| row).collect()
    }
}
