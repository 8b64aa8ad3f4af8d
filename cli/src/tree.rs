//! A spawn tree in memory, assembled from `GetSession` answers, and its text
//! form with box-drawing branches.

use std::collections::{HashMap, HashSet};

use troupe_proto::{session::Session, status::status_str, trust};

/// A session and its children, in creation order.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub session: Session,
    pub children: Vec<Node>,
}

/// Builds the tree under `root` from each session and its children's ids.
/// Sessions not in `sessions` are left out; a repeated id is shown once.
pub fn assemble(
    root: &str,
    sessions: &HashMap<String, Session>,
    children: &HashMap<String, Vec<String>>,
) -> Option<Node> {
    fn build(
        id: &str,
        sessions: &HashMap<String, Session>,
        children: &HashMap<String, Vec<String>>,
        seen: &mut HashSet<String>,
    ) -> Option<Node> {
        if !seen.insert(id.to_owned()) {
            return None;
        }
        let session = sessions.get(id)?.clone();
        let kids = children
            .get(id)
            .into_iter()
            .flatten()
            .filter_map(|child| build(child, sessions, children, seen))
            .collect();
        Some(Node {
            session,
            children: kids,
        })
    }
    build(root, sessions, children, &mut HashSet::new())
}

/// Returns one session as a line: `sess_x  running  direct  coordinator  "title"`.
pub fn line(s: &Session) -> String {
    let mut out = format!(
        "{}  {}  {}  {}",
        s.session_id,
        status_str(s.status()),
        trust::as_str(s.trust_level()),
        if s.agent_name.is_empty() {
            "-"
        } else {
            &s.agent_name
        },
    );
    if !s.title.is_empty() {
        out.push_str("  ");
        out.push_str(&crate::safe::quoted(&s.title));
    }
    out
}

/// Returns the tree as text, one session a line, children under `├─`/`└─`.
pub fn render(root: &Node) -> String {
    fn children(nodes: &[Node], prefix: &str, out: &mut String) {
        for (i, node) in nodes.iter().enumerate() {
            let last = i + 1 == nodes.len();
            out.push_str(prefix);
            out.push_str(if last { "└─ " } else { "├─ " });
            out.push_str(&line(&node.session));
            out.push('\n');
            let deeper = format!("{prefix}{}", if last { "   " } else { "│  " });
            children(&node.children, &deeper, out);
        }
    }
    let mut out = line(&root.session);
    out.push('\n');
    children(&root.children, "", &mut out);
    out
}

#[cfg(test)]
mod tests {
    use troupe_proto::session::{SessionStatus, TrustLevel};

    use super::*;

    fn session(id: &str, status: SessionStatus, trust: TrustLevel, title: &str) -> Session {
        Session {
            session_id: id.into(),
            status: status as i32,
            trust_level: trust as i32,
            agent_name: "demo".into(),
            title: title.into(),
            ..Default::default()
        }
    }

    #[test]
    fn tree_renders_with_box_drawing_branches() {
        use SessionStatus::*;
        use TrustLevel::*;
        let sessions = HashMap::from(
            [
                session("a", Running, Direct, "plan"),
                session("b", Running, Sandboxed, ""),
                session("c", Terminated, Sandboxed, "x"),
                session("d", Pending, Sandboxed, ""),
            ]
            .map(|s| (s.session_id.clone(), s)),
        );
        let children = HashMap::from([
            ("a".to_owned(), vec!["b".to_owned(), "d".to_owned()]),
            ("b".to_owned(), vec!["c".to_owned()]),
        ]);
        let tree = assemble("a", &sessions, &children).unwrap();
        assert_eq!(
            render(&tree),
            "a  running  direct  demo  \"plan\"\n\
             ├─ b  running  sandboxed  demo\n\
             │  └─ c  terminated  sandboxed  demo  \"x\"\n\
             └─ d  pending  sandboxed  demo\n"
        );
        let json = crate::render::tree(&tree);
        assert_eq!(json["children"][0]["children"][0]["session_id"], "c");
        assert_eq!(json["children"][1]["status"], "pending");
    }

    #[test]
    fn a_cycle_does_not_loop() {
        let sessions = HashMap::from(
            [session("a", SessionStatus::Running, TrustLevel::Direct, "")]
                .map(|s| (s.session_id.clone(), s)),
        );
        let children = HashMap::from([("a".to_owned(), vec!["a".to_owned()])]);
        let tree = assemble("a", &sessions, &children).unwrap();
        assert!(tree.children.is_empty());
    }
}
