//! A spawn tree in memory, assembled from `GetSession` answers, and its text
//! form with box-drawing branches: each session's own and subtree cost and
//! tokens in aligned columns, from the usage those answers carry (no call
//! more).

use std::collections::{HashMap, HashSet};

use troupe_proto::{money, session::Session, trust};

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
        crate::render::status_text(s),
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

/// Returns the tree as text, one session a line, children under `├─`/`└─`,
/// each line followed by the session's own model cost and tokens and its
/// subtree's, in columns aligned down the tree (amounts on the decimal point).
pub fn render(root: &Node) -> String {
    fn children(nodes: &[Node], prefix: &str, rows: &mut Vec<Row>) {
        for (i, node) in nodes.iter().enumerate() {
            let last = i + 1 == nodes.len();
            let branch = if last { "└─ " } else { "├─ " };
            rows.push(Row::of(format!("{prefix}{branch}"), node));
            let deeper = format!("{prefix}{}", if last { "   " } else { "│  " });
            children(&node.children, &deeper, rows);
        }
    }
    let mut rows = vec![Row::of(String::new(), root)];
    children(&root.children, "", &mut rows);
    let widths = Widths::of(&rows);
    rows.iter().map(|row| row.render(&widths)).collect()
}

/// One line of the tree before alignment: the session, and its figures if
/// its usage is known.
struct Row {
    text: String,
    usage: Option<Figures>,
}

/// A session's own and subtree cost (as exact USD) and tokens.
struct Figures {
    own: (Usd, u64),
    subtree: (Usd, u64),
}

/// An exact USD amount split on its decimal point, to align on it.
struct Usd {
    whole: String,
    fraction: String,
}

impl Usd {
    fn of(pico: u64) -> Usd {
        let text = money::usd(pico);
        let (whole, fraction) = text.split_once('.').unwrap_or((&text, ""));
        Usd {
            whole: format!("${whole}"),
            fraction: fraction.to_owned(),
        }
    }
}

impl Row {
    fn of(prefix: String, node: &Node) -> Row {
        let usage = node.session.usage.as_ref().map(|u| {
            let own = u.own_tokens.unwrap_or_default();
            Figures {
                own: (
                    Usd::of(u.own_cost_pico_usd),
                    own.input + own.output + own.cache_read + own.cache_write,
                ),
                subtree: (Usd::of(u.subtree_cost_pico_usd), u.subtree_tokens),
            }
        });
        Row {
            text: format!("{prefix}{}", line(&node.session)),
            usage,
        }
    }

    fn render(&self, w: &Widths) -> String {
        let Some(f) = &self.usage else {
            return format!("{}\n", self.text);
        };
        let column = |(usd, tokens): &(Usd, u64), c: &Column| {
            format!(
                "{:>whole$}.{:<fraction$}  {tokens:>tokens_w$} tok",
                usd.whole,
                usd.fraction,
                whole = c.whole,
                fraction = c.fraction,
                tokens_w = c.tokens,
            )
        };
        format!(
            "{:<text$}  own {}  subtree {}\n",
            self.text,
            column(&f.own, &w.own),
            column(&f.subtree, &w.subtree),
            text = w.text,
        )
    }
}

/// The widest of each part of a column, in characters.
#[derive(Default)]
struct Column {
    whole: usize,
    fraction: usize,
    tokens: usize,
}

impl Column {
    fn fit(&mut self, (usd, tokens): &(Usd, u64)) {
        self.whole = self.whole.max(usd.whole.chars().count());
        self.fraction = self.fraction.max(usd.fraction.chars().count());
        self.tokens = self.tokens.max(tokens.to_string().len());
    }
}

#[derive(Default)]
struct Widths {
    text: usize,
    own: Column,
    subtree: Column,
}

impl Widths {
    fn of(rows: &[Row]) -> Widths {
        let mut w = Widths::default();
        for row in rows.iter() {
            w.text = w.text.max(row.text.chars().count());
            if let Some(f) = &row.usage {
                w.own.fit(&f.own);
                w.subtree.fit(&f.subtree);
            }
        }
        w
    }
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

    /// Own and subtree figures follow each line, aligned down the tree: the
    /// text padded to the widest, amounts on their decimal point, tokens to
    /// the right.
    #[test]
    fn costs_are_aligned_columns() {
        use troupe_proto::session::{SessionUsage, TokenCounts};
        let with = |id: &str, own: u64, tokens: u64, subtree: u64, subtree_tokens: u64| {
            let mut s = session(id, SessionStatus::Running, TrustLevel::Direct, "");
            s.usage = Some(SessionUsage {
                own_cost_pico_usd: own,
                own_tokens: Some(TokenCounts {
                    input: tokens,
                    ..Default::default()
                }),
                subtree_cost_pico_usd: subtree,
                subtree_tokens,
                ..Default::default()
            });
            s
        };
        let sessions = HashMap::from(
            [
                with("a", 2_500_000_000_000, 900, 12_522_707_000_000, 14_701),
                with("bb", 22_707_000_000, 13_801, 10_022_707_000_000, 13_801),
                with("c", 10_000_000_000_000, 0, 10_000_000_000_000, 0),
            ]
            .map(|s| (s.session_id.clone(), s)),
        );
        let children = HashMap::from([
            ("a".to_owned(), vec!["bb".to_owned()]),
            ("bb".to_owned(), vec!["c".to_owned()]),
        ]);
        let tree = assemble("a", &sessions, &children).unwrap();
        assert_eq!(
            render(&tree),
            "a  running  direct  demo        own  $2.50        900 tok  subtree $12.522707  14701 tok\n\
             └─ bb  running  direct  demo    own  $0.022707  13801 tok  subtree $10.022707  13801 tok\n\
             \x20  └─ c  running  direct  demo  own $10.00          0 tok  subtree $10.00          0 tok\n"
        );
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
