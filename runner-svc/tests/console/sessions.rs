//! A session in the page: its output streaming, a message delivered, a
//! subtree terminated, and agents' text (a title, output, a message) shown
//! as text, never run.

use super::*;

/// What a payload would set if the page ever ran it.
const XSS_TITLE: &str = "<img src=x onerror=\"window.__xss='title'\">";
const XSS_MESSAGE: &str = "<img src=x onerror=\"window.__xss='message'\"><b>hi agent</b>";

/// The script that says whether any payload ran or made an element.
const NOTHING_RAN: &str = "return window.__xss === undefined \
    && document.querySelectorAll('img, main script, b').length === 0";

/// A session started from the console's own form, with a hostile title:
/// its output streams, coloured, and the title and the output show as
/// text. Returns the session's id.
pub(super) async fn output_streams(
    browser: &Browser,
    base: &str,
    ws: &str,
) -> anyhow::Result<String> {
    browser.goto(&format!("{base}/#/")).await?;
    browser.type_into("#create-workspace", ws).await?;
    browser.type_into("#create-agent", "talker").await?;
    browser.type_into("#create-title", XSS_TITLE).await?;
    browser.type_into("#create-message", "start").await?;
    browser.click("#create").await?;
    browser
        .until(
            "the session view",
            "return location.hash.startsWith('#/s/sess_')",
        )
        .await?;
    let talker = browser
        .js("return location.hash.slice(4)")
        .await?
        .as_str()
        .unwrap_or_default()
        .to_owned();
    browser
        .until("the coloured line", "return [...document.querySelectorAll('#output .fg-red')].some(s => s.textContent === 'red')")
        .await?;
    browser
        .until(
            "the first message echoed",
            "return document.querySelector('#output').textContent.includes('got: ')",
        )
        .await?;
    let title = browser
        .js("return document.querySelector('#session-title').textContent")
        .await?;
    ensure!(title == XSS_TITLE, "title shown as {title}");
    let output = browser
        .js("return document.querySelector('#output').textContent")
        .await?;
    ensure!(
        output
            .as_str()
            .unwrap_or_default()
            .contains("<script>window.__xss=\"output\"</script>"),
        "output: {output}"
    );
    ensure!(
        browser.js(NOTHING_RAN).await? == true,
        "a payload ran or made an element"
    );
    Ok(talker)
}

/// A message typed in the page reaches the agent's stdin and is marked
/// delivered, shown as text.
pub(super) async fn message_delivered(browser: &Browser) -> anyhow::Result<()> {
    browser.type_into("#message-text", XSS_MESSAGE).await?;
    browser.click("#send").await?;
    // The agent read it from its stdin and said so; the inbox says delivered.
    browser
        .until("the echo of the message", "return [...document.querySelectorAll('#output .line')].some(l => l.textContent.includes('got: ') && l.textContent.includes('hi agent'))")
        .await?;
    browser
        .until("none unread", "return document.querySelector('#inbox-counts')?.textContent === '2 received, 0 unread'")
        .await?;
    browser
        .until("the message marked delivered", &format!(
            "return [...document.querySelectorAll('#messages li.in')].some(m => m.querySelector('.body').textContent === {} && m.querySelector('.meta').textContent.includes('delivered'))",
            serde_json::json!(XSS_MESSAGE)
        ))
        .await?;
    ensure!(
        browser.js(NOTHING_RAN).await? == true,
        "a payload ran or made an element"
    );
    Ok(())
}

/// The hostile title shows as text in the tree too.
pub(super) async fn agent_text_stays_text_in_the_tree(
    browser: &Browser,
    base: &str,
    ws: &str,
) -> anyhow::Result<()> {
    browser.goto(&format!("{base}/#/w/{ws}")).await?;
    browser
        .until("the hostile title as text", &format!(
            "return [...document.querySelectorAll('#tree .node-title')].some(t => t.textContent === {})",
            serde_json::json!(XSS_TITLE)
        ))
        .await?;
    ensure!(
        browser.js(NOTHING_RAN).await? == true,
        "a payload ran or made an element"
    );
    Ok(())
}

/// Terminating a session from the page ends its whole subtree.
pub(super) async fn terminate_subtree(
    browser: &Browser,
    base: &str,
    ws: &str,
    pair: &Pair,
) -> anyhow::Result<()> {
    let root = pair.root(ws, "holder", "hold").await;
    let lead = pair
        .child(&root.session_id, "holder", ExecutionMode::Async)
        .await;
    let lead_id = lead.session.unwrap().session_id;
    pair.child(&root.session_id, "holder", ExecutionMode::Async)
        .await;
    pair.child(&lead_id, "holder", ExecutionMode::Async).await;
    browser
        .goto(&format!("{base}/#/s/{}", root.session_id))
        .await?;
    browser.click("#terminate").await?;
    browser.click("#confirm-terminate").await?;
    browser
        .until(
            "the notice",
            "return document.querySelector('#notice').textContent.includes('Terminated 4')",
        )
        .await?;
    browser
        .goto(&format!("{base}/#/w/{ws}/t/{}", root.tree_id))
        .await?;
    browser
        .until(
            "every node ended",
            "const rows = [...document.querySelectorAll('#tree .node-row')]; \
             return rows.length === 4 && rows.every(r => r.dataset.status === 'terminated')",
        )
        .await?;
    for id in [&root.session_id, &lead_id] {
        let status = pair.get(id).await.session.unwrap().status();
        ensure!(status == SessionStatus::Terminated, "{id} is {status:?}");
    }
    Ok(())
}
