//! The page stays live: a tree grows as its sessions are made, the page
//! resumes after the service restarts, unread counts go up and down, and
//! each event shows once however often it comes.

use super::*;

/// A team's tree grows live as its sessions are made, the spawn the depth
/// limit refused under its parent, each session once.
pub(super) async fn tree_grows_live(
    browser: &Browser,
    base: &str,
    ws: &str,
    pair: &Pair,
) -> anyhow::Result<()> {
    browser.goto(&format!("{base}/#/w/{ws}")).await?;
    browser
        .until(
            "the empty tree",
            "return document.querySelector('#active-trees')",
        )
        .await?;
    let root = pair.root(ws, "coordinator", &team_plan().to_string()).await;
    // Coordinator, backend lead, handlers: each appears as it is made,
    // and the spawn the depth limit refused, under its parent.
    browser
        .until(
            "three sessions",
            "return document.querySelectorAll('#tree .node-row').length >= 3",
        )
        .await?;
    browser
        .until("the refused spawn", "return [...document.querySelectorAll('#tree .refused')].some(r => r.textContent.includes('DEPTH_EXCEEDED'))")
        .await?;
    browser
        .until("the team done", &format!("return document.querySelector('#ended-trees [data-session-id=\"{}\"]')?.dataset.status === 'completed'", root.session_id))
        .await?;
    // Each session once: no event was applied twice.
    let rows = browser
        .js("const ids = [...document.querySelectorAll('#tree .node-row')].map(r => r.dataset.sessionId); return [ids.length, new Set(ids).size]")
        .await?;
    ensure!(rows[0] == rows[1], "a session shown twice: {rows}");
    Ok(())
}

// A stop of the service ends the page's stream; it reconnects and
// resumes after its last event: every line shows once.
pub(super) async fn resumes_after_a_restart(
    browser: &Browser,
    base: &str,
    talker: &str,
    pair: &mut Pair,
) -> anyhow::Result<()> {
    browser.goto(&format!("{base}/#/s/{talker}")).await?;
    browser
        .until(
            "the output",
            "return document.querySelector('#output').textContent.includes('hello')",
        )
        .await?;
    pair.server.restart().await;
    // Only the reconnected stream can bring the echo of this one.
    browser
        .type_into("#message-text", "after the restart")
        .await?;
    browser.click("#send").await?;
    browser
        .until(
            "the echo after the restart",
            "return document.querySelector('#output').textContent.includes('after the restart')",
        )
        .await?;
    let counts = browser
        .js("const lines = [...document.querySelectorAll('#output .line')].map(l => l.textContent); \
             return [lines.filter(l => l.startsWith('hello')).length, lines.filter(l => l.includes('after the restart')).length, lines.filter(l => l.includes('forged')).length]")
        .await?;
    ensure!(
        counts == serde_json::json!([1, 1, 1]),
        "lines shown (hello, after, forged): {counts}"
    );
    Ok(())
}

// Whatever the transport repeats, the page applies each event once:
// here every event reaches the page twice (the browser's own
// EventSource, each message handed over twice).
pub(super) async fn repeated_events_show_once(
    browser: &Browser,
    base: &str,
    talker: &str,
) -> anyhow::Result<()> {
    browser.goto(&format!("{base}/#/")).await?;
    browser.wait_for("#workspaces").await?;
    browser
        .js("const Real = window.EventSource; window.EventSource = class extends Real { \
             addEventListener(type, listener, options) { \
               super.addEventListener(type, type === 'session' ? (e) => { listener(e); listener(e); } : listener, options); } }; \
             return true")
        .await?;
    browser
        .js(&format!("location.hash = '#/s/{talker}'; return true"))
        .await?;
    browser
        .until(
            "the last echo",
            "return document.querySelector('#output').textContent.includes('after the restart')",
        )
        .await?;
    let counts = browser
        .js("const lines = [...document.querySelectorAll('#output .line')].map(l => l.textContent); \
             return [lines.filter(l => l.startsWith('hello')).length, lines.filter(l => l.includes('after the restart')).length]")
        .await?;
    ensure!(
        counts == serde_json::json!([1, 1]),
        "lines shown (hello, after): {counts}"
    );
    Ok(())
}

// A session whose agent cannot start yet (its runner is down) keeps
// its messages unread: the tree's snapshot counts them, a new one adds
// to them live, and once the runner is back and the agent is handed
// them the count drops on the same page, with no reload.
pub(super) async fn unread_counts_live(
    browser: &Browser,
    base: &str,
    ws: &str,
    pair: &mut Pair,
) -> anyhow::Result<()> {
    pair.runner.stop().await;
    let root = pair.root(ws, "holder", "hold").await;
    let row = format!(
        "document.querySelector('#tree [data-session-id=\"{}\"]')",
        root.session_id
    );
    browser
        .goto(&format!("{base}/#/w/{ws}/t/{}", root.tree_id))
        .await?;
    browser
        .until(
            "the initial message unread, from the snapshot",
            &format!(
                "const r = {row}; return r && r.querySelector('.inbox')?.textContent === '1 msg' \
             && r.querySelector('.unread')?.textContent === '1 unread'"
            ),
        )
        .await?;
    browser.js("window.__same_page = true; return true").await?;
    pair.server
        .operator()
        .await
        .send_message(troupe_proto::session::SendMessageRequest {
            session_id: root.session_id.clone(),
            message: "while you wait".to_owned(),
            request_id: String::new(),
        })
        .await?;
    browser
        .until(
            "two unread, live",
            &format!(
                "const r = {row}; return r.querySelector('.inbox')?.textContent === '2 msg' \
             && r.querySelector('.unread')?.textContent === '2 unread'"
            ),
        )
        .await?;
    pair.runner.start_again().await;
    browser
        .until("none unread once delivered", &format!(
            "const r = {row}; return r.dataset.status === 'running' \
             && r.querySelector('.inbox')?.textContent === '2 msg' && r.querySelector('.unread') === null"))
        .await?;
    ensure!(
        browser.js("return window.__same_page === true").await? == true,
        "the page was reloaded"
    );
    let got = pair.get(&root.session_id).await;
    ensure!(
        (got.inbox_count, got.unread_count) == (2, 0),
        "inbox {} unread {}",
        got.inbox_count,
        got.unread_count
    );
    Ok(())
}

// Events after the snapshot's cursor may repeat what it counted: the
// page's model (the module itself, in the page) counts each message
// once, whether it came in the snapshot or an event, or both.
pub(super) async fn snapshot_counts_are_not_counted_again(browser: &Browser) -> anyhow::Result<()> {
    let counts = browser
        .js("return import('/tree.js').then(({ TreeModel, unread }) => { \
               const m = new TreeModel(); \
               m.load({ sessions: [{ session_id: 's', status: 'running', \
                 inbox: { received: 2, delivered_through: 1, unread: 1 }, progress: null }], refused: [] }); \
               const ev = (kind, detail) => m.apply({ kind, session_id: 's', status: 'running', detail }); \
               const now = () => [m.nodes.get('s').received, unread(m.nodes.get('s'))]; \
               ev('message', { inbox_sequence: 2 }); ev('delivered', { through_sequence: 1 }); \
               const repeated = now(); \
               ev('message', { inbox_sequence: 3 }); const grown = now(); \
               ev('delivered', { through_sequence: 3 }); return [repeated, grown, now()]; })")
        .await?;
    ensure!(
        counts == serde_json::json!([[2, 1], [3, 2], [3, 0]]),
        "received, unread: {counts}"
    );
    Ok(())
}
