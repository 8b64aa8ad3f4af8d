//! The web console in a real browser (headless Chromium through
//! chromedriver), against a real session service driving a real runner and
//! Docker: signing in, a team's tree growing live, a session's output
//! streaming, a message delivered, a subtree terminated, a node's unread
//! messages counted up and down live, agents' text
//! shown as text, refusals without the cookie or the CSRF token, and a
//! page that resumes after the service restarts without showing an event
//! twice. One browser goes through the steps in turn; a failed step keeps
//! a screenshot (`troupe_tests::browser`). And, in a process that exports
//! spans (so that sessions have trace ids), a session's trace link.

mod common;
#[path = "console/http.rs"]
mod http;

use anyhow::ensure;
use common::pair::*;
use hyper::{Method, StatusCode};
use troupe_proto::session::{ExecutionMode, SessionStatus};
use troupe_tests::{OPERATOR_TOKEN, browser::Browser, otlp::exporting_test, ports::free_addr};

/// What a payload would set if the page ever ran it.
const XSS_TITLE: &str = "<img src=x onerror=\"window.__xss='title'\">";
const XSS_MESSAGE: &str = "<img src=x onerror=\"window.__xss='message'\"><b>hi agent</b>";
/// The talker prints this (and colours), then echoes each stdin line.
const TALKER: &str = "printf 'hello \\033[31mred\\033[0m world\\n'; \
    echo '<script>window.__xss=\"output\"</script><img src=x onerror=\"window.__xss=1\">'; \
    while read line; do echo \"got: $line\"; done";

/// The script that says whether any payload ran or made an element.
const NOTHING_RAN: &str = "return window.__xss === undefined \
    && document.querySelectorAll('img, main script, b').length === 0";

#[tokio::test]
async fn the_console_shows_a_team_live_and_acts_on_it_in_a_real_browser() {
    require_agent_tools();
    let console = free_addr();
    let mut pair = Pair::start_with(|c| c.console.console_listen = Some(console)).await;
    troupe_tests::http::wait_listening(console).await;
    let base = format!("http://{console}");
    let ws = pair.runner.workspace("console");
    for name in ["coordinator", "specialist"] {
        pair.agent_command(&ws, name, &["troupe-demo-agent"]);
    }
    pair.agent(&ws, "talker", TALKER);
    pair.agent(&ws, "holder", "while read line; do :; done");
    let browser = Browser::start().await;

    browser
        .step("sign_in", async {
            browser.goto(&format!("{base}/")).await?;
            browser.type_into("#token", "not-the-operator-token-0000").await?;
            browser.click("#sign-in").await?;
            browser
                .until("the refusal", "return document.querySelector('#sign-in-error').textContent.includes('not the operator token')")
                .await?;
            browser.type_into("#token", OPERATOR_TOKEN).await?;
            browser.click("#sign-in").await?;
            browser.wait_for("#workspaces table, #workspaces p").await?;
            browser.until("the workspace", &format!("return document.querySelector('[data-workspace-id=\"{ws}\"]')")).await?;
            // The token is nowhere the page or a script can read it.
            let url = browser.client.current_url().await?.to_string();
            ensure!(!url.contains(OPERATOR_TOKEN), "token in the URL {url}");
            let found = browser
                .js(&format!(
                    "const t = '{OPERATOR_TOKEN}'; return [localStorage.length, sessionStorage.length, \
                     document.documentElement.outerHTML.includes(t), document.cookie.includes('troupe_console'), \
                     document.querySelector('#token') !== null]"
                ))
                .await?;
            ensure!(found == serde_json::json!([0, 0, false, false, false]), "token or cookie readable: {found}");
            Ok(())
        })
        .await;

    browser
        .step("tree_grows_live", async {
            browser.goto(&format!("{base}/#/w/{ws}")).await?;
            browser.until("the empty tree", "return document.querySelector('#active-trees')").await?;
            let root = pair.root(&ws, "coordinator", &team_plan().to_string()).await;
            // Coordinator, backend lead, handlers: each appears as it is made,
            // and the spawn the depth limit refused, under its parent.
            browser
                .until("three sessions", "return document.querySelectorAll('#tree .node-row').length >= 3")
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
        })
        .await;

    // Started from the console's own form, with a hostile title.
    let mut talker = String::new();
    browser
        .step("output_streams", async {
            browser.goto(&format!("{base}/#/")).await?;
            browser.type_into("#create-workspace", &ws).await?;
            browser.type_into("#create-agent", "talker").await?;
            browser.type_into("#create-title", XSS_TITLE).await?;
            browser.type_into("#create-message", "start").await?;
            browser.click("#create").await?;
            browser.until("the session view", "return location.hash.startsWith('#/s/sess_')").await?;
            talker = browser.js("return location.hash.slice(4)").await?.as_str().unwrap_or_default().to_owned();
            browser
                .until("the coloured line", "return [...document.querySelectorAll('#output .fg-red')].some(s => s.textContent === 'red')")
                .await?;
            browser.until("the first message echoed", "return document.querySelector('#output').textContent.includes('got: ')").await?;
            let title = browser.js("return document.querySelector('#session-title').textContent").await?;
            ensure!(title == XSS_TITLE, "title shown as {title}");
            let output = browser.js("return document.querySelector('#output').textContent").await?;
            ensure!(output.as_str().unwrap_or_default().contains("<script>window.__xss=\"output\"</script>"), "output: {output}");
            ensure!(browser.js(NOTHING_RAN).await? == true, "a payload ran or made an element");
            Ok(())
        })
        .await;

    browser
        .step("message_delivered", async {
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
            ensure!(browser.js(NOTHING_RAN).await? == true, "a payload ran or made an element");
            Ok(())
        })
        .await;

    browser
        .step("agent_text_stays_text_in_the_tree", async {
            browser.goto(&format!("{base}/#/w/{ws}")).await?;
            browser
                .until("the hostile title as text", &format!(
                    "return [...document.querySelectorAll('#tree .node-title')].some(t => t.textContent === {})",
                    serde_json::json!(XSS_TITLE)
                ))
                .await?;
            ensure!(browser.js(NOTHING_RAN).await? == true, "a payload ran or made an element");
            Ok(())
        })
        .await;

    browser
        .step("refused_without_cookie_or_csrf", async {
            let url = format!("{base}/api/sessions/{talker}/messages");
            let json = ("content-type", "application/json");
            let body = r#"{"message":"forged"}"#;
            let plain = http::send(Method::GET, &format!("{base}/api/workspaces"), &[], "").await;
            ensure!(
                plain.status == StatusCode::UNAUTHORIZED,
                "no cookie: {}",
                plain.status
            );
            let forged = http::send(
                Method::POST,
                &url,
                &[json, ("x-troupe-csrf", "guess")],
                body,
            )
            .await;
            ensure!(
                forged.status == StatusCode::UNAUTHORIZED,
                "no cookie: {}",
                forged.status
            );
            // A sign-in of our own: the cookie, and its CSRF token.
            let signed = http::send(
                Method::POST,
                &format!("{base}/api/sign-in"),
                &[json],
                &serde_json::json!({"token": OPERATOR_TOKEN}).to_string(),
            )
            .await;
            ensure!(
                signed.status == StatusCode::OK,
                "sign-in: {}",
                signed.status
            );
            let set_cookie = signed.headers["set-cookie"].to_str()?.to_owned();
            for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
                ensure!(
                    set_cookie.contains(attribute),
                    "cookie without {attribute}: {set_cookie}"
                );
            }
            let cookie = set_cookie.split(';').next().unwrap_or_default().to_owned();
            let csrf = signed.json()["csrf_token"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let cookie = ("cookie", cookie.as_str());
            for (what, headers) in [
                ("no CSRF token", vec![json, cookie]),
                (
                    "a wrong CSRF token",
                    vec![json, cookie, ("x-troupe-csrf", "wrong")],
                ),
                (
                    "a form's content type",
                    vec![
                        ("content-type", "text/plain"),
                        cookie,
                        ("x-troupe-csrf", csrf.as_str()),
                    ],
                ),
            ] {
                let answer = http::send(Method::POST, &url, &headers, body).await;
                ensure!(
                    answer.status == StatusCode::FORBIDDEN,
                    "{what}: {} {}",
                    answer.status,
                    answer.body
                );
            }
            // A stream resumes after the Last-Event-ID it is given.
            let events = format!("{base}/api/events?session={talker}");
            let first = http::first_event_ids(&events, &[cookie], 2).await;
            let resumed = http::first_event_ids(
                &events,
                &[cookie, ("last-event-id", &first[0].to_string())],
                1,
            )
            .await;
            ensure!(
                resumed == [first[1]],
                "resumed after {}: {resumed:?}, not {}",
                first[0],
                first[1]
            );
            let unsigned = http::send(Method::GET, &events, &[], "").await;
            ensure!(
                unsigned.status == StatusCode::UNAUTHORIZED,
                "events without a cookie: {}",
                unsigned.status
            );
            // The same request with the token is served: the refusals were the token's.
            let served = http::send(
                Method::POST,
                &url,
                &[json, cookie, ("x-troupe-csrf", csrf.as_str())],
                body,
            )
            .await;
            ensure!(
                served.status == StatusCode::OK,
                "with the token: {} {}",
                served.status,
                served.body
            );
            ensure!(
                served.headers["cache-control"] == "no-store",
                "API answers are not cached"
            );
            let page = http::send(Method::GET, &format!("{base}/"), &[], "").await;
            let csp = page.headers["content-security-policy"].to_str()?;
            ensure!(
                csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
                "CSP: {csp}"
            );
            Ok(())
        })
        .await;

    // A stop of the service ends the page's stream; it reconnects and
    // resumes after its last event: every line shows once.
    browser
        .step("resumes_after_a_restart", async {
            browser.goto(&format!("{base}/#/s/{talker}")).await?;
            browser.until("the output", "return document.querySelector('#output').textContent.includes('hello')").await?;
            pair.server.restart().await;
            // Only the reconnected stream can bring the echo of this one.
            browser.type_into("#message-text", "after the restart").await?;
            browser.click("#send").await?;
            browser
                .until("the echo after the restart", "return document.querySelector('#output').textContent.includes('after the restart')")
                .await?;
            let counts = browser
                .js("const lines = [...document.querySelectorAll('#output .line')].map(l => l.textContent); \
                     return [lines.filter(l => l.startsWith('hello')).length, lines.filter(l => l.includes('after the restart')).length, lines.filter(l => l.includes('forged')).length]")
                .await?;
            ensure!(counts == serde_json::json!([1, 1, 1]), "lines shown (hello, after, forged): {counts}");
            Ok(())
        })
        .await;

    // Whatever the transport repeats, the page applies each event once:
    // here every event reaches the page twice (the browser's own
    // EventSource, each message handed over twice).
    browser
        .step("repeated_events_show_once", async {
            browser.goto(&format!("{base}/#/")).await?;
            browser.wait_for("#workspaces").await?;
            browser
                .js("const Real = window.EventSource; window.EventSource = class extends Real { \
                     addEventListener(type, listener, options) { \
                       super.addEventListener(type, type === 'session' ? (e) => { listener(e); listener(e); } : listener, options); } }; \
                     return true")
                .await?;
            browser.js(&format!("location.hash = '#/s/{talker}'; return true")).await?;
            browser
                .until("the last echo", "return document.querySelector('#output').textContent.includes('after the restart')")
                .await?;
            let counts = browser
                .js("const lines = [...document.querySelectorAll('#output .line')].map(l => l.textContent); \
                     return [lines.filter(l => l.startsWith('hello')).length, lines.filter(l => l.includes('after the restart')).length]")
                .await?;
            ensure!(counts == serde_json::json!([1, 1]), "lines shown (hello, after): {counts}");
            Ok(())
        })
        .await;

    browser
        .step("terminate_subtree", async {
            let root = pair.root(&ws, "holder", "hold").await;
            let lead = pair.child(&root.session_id, "holder", ExecutionMode::Async).await;
            let lead_id = lead.session.unwrap().session_id;
            pair.child(&root.session_id, "holder", ExecutionMode::Async).await;
            pair.child(&lead_id, "holder", ExecutionMode::Async).await;
            browser.goto(&format!("{base}/#/s/{}", root.session_id)).await?;
            browser.click("#terminate").await?;
            browser.click("#confirm-terminate").await?;
            browser.until("the notice", "return document.querySelector('#notice').textContent.includes('Terminated 4')").await?;
            browser.goto(&format!("{base}/#/w/{ws}/t/{}", root.tree_id)).await?;
            browser
                .until("every node ended", "const rows = [...document.querySelectorAll('#tree .node-row')]; \
                     return rows.length === 4 && rows.every(r => r.dataset.status === 'terminated')")
                .await?;
            for id in [&root.session_id, &lead_id] {
                let status = pair.get(id).await.session.unwrap().status();
                ensure!(status == SessionStatus::Terminated, "{id} is {status:?}");
            }
            Ok(())
        })
        .await;

    // A session whose agent cannot start yet (its runner is down) keeps
    // its messages unread: the tree's snapshot counts them, a new one adds
    // to them live, and once the runner is back and the agent is handed
    // them the count drops on the same page, with no reload.
    browser
        .step("unread_counts_live", async {
            pair.runner.stop().await;
            let root = pair.root(&ws, "holder", "hold").await;
            let row = format!("document.querySelector('#tree [data-session-id=\"{}\"]')", root.session_id);
            browser.goto(&format!("{base}/#/w/{ws}/t/{}", root.tree_id)).await?;
            browser
                .until("the initial message unread, from the snapshot", &format!(
                    "const r = {row}; return r && r.querySelector('.inbox')?.textContent === '1 msg' \
                     && r.querySelector('.unread')?.textContent === '1 unread'"))
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
                .until("two unread, live", &format!(
                    "const r = {row}; return r.querySelector('.inbox')?.textContent === '2 msg' \
                     && r.querySelector('.unread')?.textContent === '2 unread'"))
                .await?;
            pair.runner.start_again().await;
            browser
                .until("none unread once delivered", &format!(
                    "const r = {row}; return r.dataset.status === 'running' \
                     && r.querySelector('.inbox')?.textContent === '2 msg' && r.querySelector('.unread') === null"))
                .await?;
            ensure!(browser.js("return window.__same_page === true").await? == true, "the page was reloaded");
            let got = pair.get(&root.session_id).await;
            ensure!((got.inbox_count, got.unread_count) == (2, 0), "inbox {} unread {}", got.inbox_count, got.unread_count);
            Ok(())
        })
        .await;

    // Events after the snapshot's cursor may repeat what it counted: the
    // page's model (the module itself, in the page) counts each message
    // once, whether it came in the snapshot or an event, or both.
    browser
        .step("snapshot_counts_are_not_counted_again", async {
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
            ensure!(counts == serde_json::json!([[2, 1], [3, 2], [3, 0]]), "received, unread: {counts}");
            Ok(())
        })
        .await;

    browser
        .step("sign_out", async {
            browser.click("#sign-out").await?;
            browser.wait_for("#sign-in-form").await?;
            browser.goto(&format!("{base}/#/")).await?;
            browser.wait_for("#sign-in-form").await?;
            Ok(())
        })
        .await;
    browser.close().await;
}

/// Where the console links a session's trace.
const TRACE_URL: &str = "http://127.0.0.1:16686/trace/{trace_id}";

/// A session's page links its trace with `--console-trace-url`'s template.
/// Its body runs in a process that exports spans (`exporting_test`): only
/// there do sessions have a trace id.
#[test]
fn a_session_links_its_trace_in_a_real_browser() {
    require_agent_tools();
    exporting_test(
        "a_session_links_its_trace_in_a_real_browser",
        |_receiver| async move {
            let _telemetry = troupe_telemetry::init("troupe-console-test", "warn", None).unwrap();
            let console = free_addr();
            let pair = Pair::start_with(|c| {
                c.console.console_listen = Some(console);
                c.console.console_trace_url = Some(TRACE_URL.to_owned());
            })
            .await;
            troupe_tests::http::wait_listening(console).await;
            let ws = pair.runner.workspace("console-trace");
            pair.agent(&ws, "holder", "while read line; do :; done");
            let root = pair.root(&ws, "holder", "hold").await;
            let browser = Browser::start().await;
            browser
                .step("trace_link", async {
                    let trace_id = pair
                        .get(&root.session_id)
                        .await
                        .session
                        .map(|s| s.trace_id)
                        .unwrap_or_default();
                    ensure!(
                        trace_id.len() == 32,
                        "the session has no trace id: {trace_id:?}"
                    );
                    browser.goto(&format!("http://{console}/")).await?;
                    browser.type_into("#token", OPERATOR_TOKEN).await?;
                    browser.click("#sign-in").await?;
                    browser.wait_for("#workspaces").await?;
                    browser
                        .goto(&format!("http://{console}/#/s/{}", root.session_id))
                        .await?;
                    // Read in one go: the page redraws the session's view
                    // as its events come, replacing the link's element.
                    let link = browser
                        .until(
                            "the trace link",
                            "const a = document.querySelector('#trace-link'); \
                             return a && [a.getAttribute('href'), a.getAttribute('rel')];",
                        )
                        .await?;
                    let attr = |i: usize| link[i].as_str().unwrap_or_default().to_owned();
                    let (href, rel) = (attr(0), attr(1));
                    ensure!(
                        href == TRACE_URL.replace("{trace_id}", &trace_id),
                        "trace link {href}"
                    );
                    ensure!(
                        rel.contains("noopener") && rel.contains("noreferrer"),
                        "rel {rel}"
                    );
                    Ok(())
                })
                .await;
            browser.close().await;
        },
    );
}

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
