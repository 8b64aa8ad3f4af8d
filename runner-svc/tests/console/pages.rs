//! A workspace larger than a page of the tree's snapshot, whole and live.

use super::*;

/// A workspace larger than a page of the tree's snapshot (three pages of
/// 500 sessions at most): every session shows once, under its parent, and
/// an event for a session of the last page shows live. No runner: the
/// sessions are made in the store and stay pending.
#[tokio::test]
async fn a_workspace_larger_than_a_page_shows_whole_and_live_in_a_real_browser() {
    const TREES: usize = 6;
    const CHILDREN: usize = 199;
    let (server, base, roots) = troupe_tests::console::server_with_trees(TREES, CHILDREN).await;
    let last_root = roots.last().cloned().unwrap_or_default();
    let last = format!("sess_child_{:05}_{:05}", TREES - 1, CHILDREN - 1);
    let browser = Browser::start().await;
    browser
        .step("every_page_drawn", async {
            browser.goto(&format!("{base}/#/w/alpha")).await?;
            browser.type_into("#token", OPERATOR_TOKEN).await?;
            browser.click("#sign-in").await?;
            browser
                .until("every row", &format!("return document.querySelectorAll('#tree .node-row').length === {}", TREES * (1 + CHILDREN)))
                .await?;
            let rows = browser
                .js("const ids = [...document.querySelectorAll('#tree .node-row')].map(r => r.dataset.sessionId); return [ids.length, new Set(ids).size]")
                .await?;
            ensure!(rows[0] == rows[1], "a session shown twice: {rows}");
            let pages = browser
                .js("return performance.getEntriesByType('resource').filter(e => e.name.includes('/api/workspaces/alpha/sessions')).length")
                .await?;
            ensure!(pages.as_u64() >= Some(3), "the snapshot in {pages} pages");
            // The last page's session is under its root, from the first page.
            let nested = browser
                .js(&format!(
                    "const row = document.querySelector('#tree [data-session-id=\"{last}\"]'); \
                     const root = document.querySelector('#tree [data-session-id=\"{last_root}\"]'); \
                     return !!row && !!root && root.closest('li').contains(row) && root.closest('li') !== row.closest('li')"
                ))
                .await?;
            ensure!(nested == true, "{last} not under {last_root}");
            Ok(())
        })
        .await;
    browser
        .step("last_page_live", async {
            server
                .operator()
                .await
                .send_message(troupe_proto::session::SendMessageRequest {
                    session_id: last.clone(),
                    message: "to the last page".to_owned(),
                    request_id: String::new(),
                })
                .await?;
            browser
                .until("the message counted live", &format!(
                    "return document.querySelector('#tree [data-session-id=\"{last}\"] .inbox')?.textContent === '1 msg'"
                ))
                .await?;
            Ok(())
        })
        .await;
    browser.close().await;
}
