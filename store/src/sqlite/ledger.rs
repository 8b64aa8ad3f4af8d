//! [`Ledger`]: the sessions table held in memory, so that reads (the caller's
//! row on every call, spawn quotas, lists, children) cost no round trip to
//! the database.
//!
//! The SQLite store's own cache, private to it: the store owns its database
//! alone (the exclusive lock `claim` takes in `open.rs`) and changes the
//! ledger only after a commit, under its writer lock, with the rows it
//! committed: the ledger is always a state the database was in, and a
//! reader never sees a row that was not committed. Every session ever
//! created is kept (under a kilobyte each, see BENCHMARKS.md), as the table
//! keeps them.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use crate::{
    creates::SpawnFacts,
    model::{SessionId, SessionRow, TreeId, Trust, WorkspaceId},
};

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

/// The sessions table, in memory, with the indexes the reads need.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    sessions: HashMap<SessionId, Entry>,
    workspaces: HashMap<WorkspaceId, Workspace>,
    /// Sessions per tree, direct and sandboxed ([`trust_index`]).
    trees: HashMap<TreeId, [u32; 2]>,
    /// Children of each session, by rowid.
    children: HashMap<SessionId, Vec<(i64, SessionId)>>,
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
                self.trees.entry(row.tree_id.clone()).or_default()[trust_index(row.trust)] += 1;
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
        let tree = self
            .trees
            .get(&parent.row.tree_id)
            .copied()
            .unwrap_or_default();
        Some(SpawnFacts {
            tree_sessions: tree.iter().sum(),
            tree_sandboxed: tree[trust_index(Trust::Sandboxed)],
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
    pub fn active_counts(&self) -> Vec<(WorkspaceId, Trust, u32)> {
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
    pub fn ancestors(&self, session_id: &str) -> Vec<SessionId> {
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
    pub fn active_subtree(&self, session_id: &str) -> Vec<SessionId> {
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
                    out.push((*id).into());
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

#[cfg(test)]
mod tests {
    use troupe_proto::session::SessionStatus;

    use super::*;

    /// A pending session `id` of workspace `ws`, in `parent`'s tree (or a
    /// tree of its own).
    fn row(id: &str, ws: &str, parent: Option<&SessionRow>, trust: Trust) -> SessionRow {
        SessionRow {
            session_id: id.into(),
            workspace_id: ws.into(),
            parent_session_id: parent.map(|p| p.session_id.clone()),
            parent_trust: parent.map(|p| p.trust),
            tree_id: parent.map_or_else(|| format!("tree_{id}").into(), |p| p.tree_id.clone()),
            depth: parent.map_or(0, |p| p.depth + 1),
            trust,
            agent_name: "echo".to_owned(),
            agent_command: "[]".to_owned(),
            title: String::new(),
            status: SessionStatus::Pending,
            created_by: crate::model::Principal::Operator,
            created_at_ms: 0,
            ended_at_ms: None,
            end_reason: None,
            spawn_tat_ms: 0,
            inbox_seq: 0,
            trace: None,
            write_scope: Default::default(),
            on_parent_end: Default::default(),
            orphaned: false,
        }
    }

    fn ended(mut row: SessionRow) -> SessionRow {
        row.status = SessionStatus::Terminated;
        row
    }

    fn ids(rows: &[SessionRow]) -> Vec<&str> {
        rows.iter().map(|r| r.session_id.as_str()).collect()
    }

    /// root ─┬─ a ── a1
    ///       └─ b
    /// in workspace `ws`, plus `other` in workspace `ws2`; rowids in
    /// creation order.
    fn tree() -> (Ledger, [SessionRow; 5]) {
        let root = row("root", "ws", None, Trust::Direct);
        let a = row("a", "ws", Some(&root), Trust::Sandboxed);
        let b = row("b", "ws", Some(&root), Trust::Direct);
        let a1 = row("a1", "ws", Some(&a), Trust::Sandboxed);
        let other = row("other", "ws2", None, Trust::Sandboxed);
        let rows = [root, a, b, a1, other];
        let ledger = Ledger::load(
            rows.iter()
                .cloned()
                .enumerate()
                .map(|(i, r)| (i as i64 + 1, r)),
        );
        (ledger, rows)
    }

    #[test]
    fn puts_count_trees_children_and_active_sessions() {
        let (ledger, _) = tree();
        let facts = ledger.spawn_facts("root").expect("root is stored");
        assert_eq!(facts.parent.session_id, "root");
        assert_eq!(facts.tree_sessions, 4);
        assert_eq!(facts.children, 2);
        assert_eq!(facts.workspace_active, 4);
        assert_eq!(ledger.spawn_facts("a").map(|f| f.children), Some(1));
        assert_eq!(
            ledger.spawn_facts("other").map(|f| f.tree_sessions),
            Some(1)
        );
        assert!(ledger.spawn_facts("nobody").is_none());
        assert_eq!(ledger.active_in_workspace("ws"), 4);
        assert_eq!(ledger.active_in_workspace("ws2"), 1);
        assert_eq!(ledger.active_in_workspace("none"), 0);
        let mut counts = ledger.active_counts();
        counts.sort_by(|x, y| (&x.0, x.1 as u8).cmp(&(&y.0, y.1 as u8)));
        assert_eq!(
            counts,
            [
                ("ws".into(), Trust::Direct, 2),
                ("ws".into(), Trust::Sandboxed, 2),
                ("ws2".into(), Trust::Sandboxed, 1),
            ]
        );
        assert_eq!(ledger.ended(), 0);
    }

    #[test]
    fn children_come_in_creation_order_whatever_the_order_of_the_puts() {
        let root = row("root", "ws", None, Trust::Direct);
        let mut ledger = Ledger::default();
        ledger.put(1, root.clone());
        ledger.put(5, row("late", "ws", Some(&root), Trust::Direct));
        ledger.put(3, row("early", "ws", Some(&root), Trust::Direct));
        ledger.put(4, row("middle", "ws", Some(&root), Trust::Direct));
        assert_eq!(ids(&ledger.children("root")), ["early", "middle", "late"]);
        assert!(ledger.children("early").is_empty());
        assert!(ledger.children("nobody").is_empty());
    }

    #[test]
    fn an_end_leaves_the_active_counts_once_and_the_tree_and_children_as_they_were() {
        let (mut ledger, [_, a, ..]) = tree();
        ledger.put(2, ended(a.clone()));
        assert_eq!(ledger.ended(), 1);
        assert_eq!(ledger.active_in_workspace("ws"), 3);
        // Storing the ended row again (a cancelled write's reread) ends nothing.
        ledger.put(2, ended(a));
        assert_eq!(ledger.ended(), 1);
        assert_eq!(ledger.active_in_workspace("ws"), 3);
        let facts = ledger.spawn_facts("root").expect("root is stored");
        assert_eq!((facts.tree_sessions, facts.children), (4, 2));
        assert_eq!(ids(&ledger.children("root")), ["a", "b"]);
        assert_eq!(
            ledger.get("a").map(|r| r.status),
            Some(SessionStatus::Terminated)
        );
        let sandboxed_in_ws = ledger
            .active_counts()
            .into_iter()
            .find(|(ws, trust, _)| ws == "ws" && *trust == Trust::Sandboxed)
            .map(|(_, _, n)| n);
        assert_eq!(sandboxed_in_ws, Some(1));
    }

    #[test]
    fn update_changes_a_stored_row_and_ignores_an_unknown_one() {
        let (mut ledger, _) = tree();
        ledger.update("b", |r| r.inbox_seq = 7);
        assert_eq!(ledger.get("b").map(|r| r.inbox_seq), Some(7));
        ledger.update("b", |r| r.status = SessionStatus::Completed);
        assert_eq!(ledger.ended(), 1);
        assert_eq!(ledger.active_in_workspace("ws"), 3);
        ledger.update("nobody", |r| r.inbox_seq = 9);
        assert!(ledger.get("nobody").is_none());
        assert_eq!(ledger.active_in_workspace("ws"), 3);
    }

    #[test]
    fn ancestors_come_nearest_first() {
        let (ledger, _) = tree();
        assert_eq!(ledger.ancestors("a1"), ["a", "root"]);
        assert!(ledger.ancestors("root").is_empty());
        assert!(ledger.ancestors("nobody").is_empty());
    }

    #[test]
    fn the_active_subtree_is_level_by_level_and_passes_through_ended_sessions() {
        let (mut ledger, [_, a, ..]) = tree();
        assert_eq!(ledger.active_subtree("root"), ["root", "a", "b", "a1"]);
        ledger.put(2, ended(a));
        assert_eq!(ledger.active_subtree("root"), ["root", "b", "a1"]);
        assert_eq!(ledger.active_subtree("a"), ["a1"]);
        assert!(ledger.active_subtree("nobody").is_empty());
    }

    #[test]
    fn active_is_every_pending_or_running_session_in_creation_order() {
        let (mut ledger, [_, _, b, ..]) = tree();
        ledger.put(3, ended(b));
        assert_eq!(ids(&ledger.active()), ["root", "a", "a1", "other"]);
    }

    #[test]
    fn list_pages_a_workspace_with_its_filters() {
        let (mut ledger, [_, _, b, ..]) = tree();
        ledger.put(3, ended(b));
        let list = |sandboxed_only, include_ended, after, limit| {
            let (rows, next) = ledger.list("ws", sandboxed_only, include_ended, after, limit);
            let ids: Vec<SessionId> = rows.iter().map(|r| r.session_id.clone()).collect();
            (ids, next)
        };
        assert_eq!(
            list(false, true, 0, 10),
            (
                vec!["root".into(), "a".into(), "b".into(), "a1".into()],
                None
            )
        );
        assert_eq!(
            list(false, false, 0, 10),
            (vec!["root".into(), "a".into(), "a1".into()], None)
        );
        assert_eq!(
            list(true, true, 0, 10),
            (vec!["a".into(), "a1".into()], None)
        );
        // Pages: the token is the last rowid returned.
        assert_eq!(
            list(false, true, 0, 2),
            (vec!["root".into(), "a".into()], Some(2))
        );
        assert_eq!(
            list(false, true, 2, 2),
            (vec!["b".into(), "a1".into()], None)
        );
        assert_eq!(list(false, false, 1, 1), (vec!["a".into()], Some(2)));
        assert_eq!(ledger.list("none", false, true, 0, 10).0.len(), 0);
    }
}
