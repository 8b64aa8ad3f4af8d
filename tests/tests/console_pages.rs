//! A tree's snapshot in pages, over plain HTTP, on either backend: a
//! workspace of 10,000 sessions (made in the store before the service
//! starts) is read a bounded page at a time, every session once, a parent
//! before its children, and no answer of the console is over 1 MiB; a
//! session with more children than its view holds names the oldest and
//! counts them all.

use std::{collections::HashSet, time::Instant};

use hyper::{Method, StatusCode};
use troupe_tests::{
    console::{self, LIMIT},
    http,
};

/// Trees in the workspace, of `1 + CHILDREN` sessions each.
const TREES: usize = 100;
const CHILDREN: usize = 99;
/// The largest answer allowed.
const MAX_ANSWER: usize = 1024 * 1024;

async fn get(base: &str, path: &str, cookie: &str) -> http::Answer {
    let answer = http::send(
        Method::GET,
        &format!("{base}{path}"),
        &[("cookie", cookie)],
        "",
        LIMIT,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{path}: {}", answer.body);
    assert!(
        answer.body.len() <= MAX_ANSWER,
        "{path}: {} bytes",
        answer.body.len()
    );
    answer
}

/// A session as a snapshot's page gives it: id, parent, tree.
type Node = (String, String, String);

/// Reads every page of `path` (a tree's snapshot); the sessions in the
/// order given, and the pages' count.
async fn every_page(base: &str, path: &str, cookie: &str) -> (Vec<Node>, usize) {
    let mut sessions = Vec::new();
    let mut after = String::new();
    let mut pages = 0;
    let mut cursor = None;
    loop {
        let page = get(base, &format!("{path}after={after}"), cookie)
            .await
            .json();
        pages += 1;
        // Every page's cursor was read before it: none is older than the first's.
        let at = troupe_tests::position(page["cursor"].as_str().expect("a cursor"), "alpha");
        assert!(cursor.is_none_or(|first| at >= first), "cursor {at}");
        cursor.get_or_insert(at);
        assert_eq!(
            page.get("refused").is_some(),
            pages == 1,
            "refusals: first page only"
        );
        for s in page["sessions"].as_array().expect("sessions") {
            let text = |key: &str| s[key].as_str().unwrap_or_default().to_owned();
            sessions.push((
                text("session_id"),
                text("parent_session_id"),
                text("tree_id"),
            ));
        }
        match page["next"].as_str() {
            Some(next) => after = next.to_owned(),
            None => return (sessions, pages),
        }
    }
}

#[tokio::test]
async fn a_workspace_of_ten_thousand_sessions_is_served_in_pages_under_a_mebibyte() {
    let (_server, base, roots) = console::server_with_trees(TREES, CHILDREN).await;
    let signed = console::sign_in(&base).await;
    let cookie = signed.cookie.as_str();

    let first = Instant::now();
    get(&base, "/api/workspaces/alpha/sessions", cookie).await;
    println!("first page: {:?}", first.elapsed());
    let started = Instant::now();
    let (sessions, pages) = every_page(&base, "/api/workspaces/alpha/sessions?", cookie).await;
    println!("{pages} pages: {:?}", started.elapsed());
    assert_eq!(sessions.len(), TREES * (1 + CHILDREN), "every session");
    let mut seen = HashSet::new();
    for (id, parent, _) in &sessions {
        assert!(
            parent.is_empty() || seen.contains(parent),
            "{id} before its parent"
        );
        assert!(seen.insert(id.clone()), "{id} twice");
    }
    assert!(pages > 1, "one page");

    // One tree's pages: its sessions alone, the rest of the workspace skipped.
    let tree_id = sessions
        .iter()
        .find(|(id, _, _)| *id == roots[TREES / 2])
        .map(|(_, _, tree)| tree.clone())
        .expect("the root");
    let path = format!("/api/workspaces/alpha/sessions?tree={tree_id}&");
    let (tree, _) = every_page(&base, &path, cookie).await;
    assert_eq!(tree.len(), 1 + CHILDREN, "the tree's sessions");
    assert!(tree.iter().all(|(_, _, t)| *t == tree_id), "another tree's");

    // The workspaces' counts and a root's view: bounded too.
    let workspaces = get(&base, "/api/workspaces", cookie).await.json();
    assert_eq!(workspaces["workspaces"][0]["trees"], TREES);
    let root = get(&base, &format!("/api/sessions/{}", roots[0]), cookie)
        .await
        .json();
    assert_eq!(root["children"].as_array().map(Vec::len), Some(CHILDREN));
}

#[tokio::test]
async fn a_session_with_more_children_than_a_view_holds_names_the_oldest_and_counts_all() {
    let (_server, base, roots) = console::server_with_trees(1, 600).await;
    let signed = console::sign_in(&base).await;
    let view = get(
        &base,
        &format!("/api/sessions/{}", roots[0]),
        &signed.cookie,
    )
    .await
    .json();
    let children = view["children"].as_array().expect("children");
    assert_eq!(children.len(), 500, "the view's bound");
    assert_eq!(view["children_count"], 600);
    assert_eq!(
        children[0]["session_id"], "sess_child_00000_00000",
        "the oldest first"
    );
}
