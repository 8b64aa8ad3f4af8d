//! The web console over plain HTTP, for its tests: a service with its
//! console on a loopback port (with a workspace of many sessions made in
//! its store, if asked), and a sign-in's cookie and CSRF token.

use std::{net::SocketAddr, time::Duration};

use futures::StreamExt;
use hyper::{Method, StatusCode};
use troupe_session_svc::{
    Config, Limits,
    model::{Action, Trust},
    policy,
    store::{PgStore, SqliteStore, prelude::*},
};

use crate::{
    OPERATOR_TOKEN, TestServer, http,
    stores::{new_session, operator_audit},
};

/// How long any console request may take in a test.
pub const LIMIT: Duration = Duration::from_secs(10);
/// The content type of every console POST.
pub const JSON: (&str, &str) = ("content-type", "application/json");

/// A service with its console on a loopback port (and `adjust`ed); the
/// console's address.
pub async fn server(adjust: impl FnOnce(&mut Config)) -> (TestServer, SocketAddr) {
    let addr = crate::ports::free_addr();
    let mut server = TestServer::start_with(|c| {
        c.console.console_listen = Some(addr);
        adjust(c);
    })
    .await;
    server.wait_listening(addr).await;
    (server, addr)
}

/// A sign-in's `cookie` header value and CSRF token.
pub struct SignedIn {
    pub cookie: String,
    pub csrf: String,
}

/// Signs in at `base` (`http://ADDR`) with the operator token.
pub async fn sign_in(base: &str) -> SignedIn {
    let answer = http::send(
        Method::POST,
        &format!("{base}/api/sign-in"),
        &[JSON],
        &serde_json::json!({ "token": OPERATOR_TOKEN }).to_string(),
        LIMIT,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let cookie = answer.headers["set-cookie"].to_str().expect("ASCII cookie");
    let cookie = cookie.split(';').next().unwrap_or_default().to_owned();
    let csrf = answer.json()["csrf_token"]
        .as_str()
        .expect("a CSRF token")
        .to_owned();
    SignedIn { cookie, csrf }
}

/// Trees [`seed_trees`] makes at once (a PostgreSQL store takes them in
/// parallel; SQLite's one writer in turn).
const SEEDING: usize = 8;

/// Makes `trees` roots of `children` children each in workspace `alpha`
/// (`sess_root_T`, `sess_child_T_C`; each tree's children in order, trees
/// [`SEEDING`] at a time), straight in the store with the service's spawn
/// rule and no limit in the way; the roots' ids, in order.
pub async fn seed_trees<S: Store>(store: &S, trees: usize, children: usize) -> Vec<String> {
    let limits = Limits {
        max_children: 1_000_000,
        max_tree_sessions: 1_000_000,
        max_active_per_workspace: 1_000_000,
        spawn_rate_per_sec: 0.0,
        ..Limits::default()
    };
    let tree = |t: usize| {
        let limits = &limits;
        async move {
            let root = format!("sess_root_{t:05}");
            store
                .create_root(
                    new_session(&root, Trust::Sandboxed),
                    None,
                    operator_audit(Action::CreateRootSession, &root),
                    &|_| Ok(Default::default()),
                )
                .await
                .expect("a root");
            for c in 0..children {
                let id = format!("sess_child_{t:05}_{c:05}");
                store
                    .create_child(
                        &root.as_str().into(),
                        new_session(&id, Trust::Sandboxed),
                        None,
                        operator_audit(Action::CreateSession, &id),
                        &|ctx| policy::admit_spawn(ctx, limits),
                    )
                    .await
                    .expect("a child");
            }
            root
        }
    };
    futures::stream::iter(0..trees)
        .map(tree)
        .buffered(SEEDING)
        .collect()
        .await
}

/// A service whose console serves workspace `alpha` of `trees` trees of
/// `1 + children` sessions, made in its store while it was stopped; the
/// console's base URL and the roots' ids.
pub async fn server_with_trees(trees: usize, children: usize) -> (TestServer, String, Vec<String>) {
    let (mut server, addr) = server(|_| {}).await;
    server.stop_for_restart().await;
    let url = server.config.database_url();
    let roots = if crate::postgres::is_postgres(&url) {
        let store = PgStore::open(&url).await.expect("postgres");
        seed_trees(&store, trees, children).await
    } else {
        let store = SqliteStore::open(&url).await.expect("sqlite");
        seed_trees(&store, trees, children).await
    };
    server.start_again().await;
    server.wait_listening(addr).await;
    (server, format!("http://{addr}"), roots)
}
