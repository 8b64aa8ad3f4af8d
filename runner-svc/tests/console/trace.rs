//! A session's page links its trace, in a process that exports spans.

use super::*;

/// Where the console links a session's trace.
const TRACE_URL: &str = "http://127.0.0.1:16686/trace/{trace_id}";

/// A session's page links its trace with `--console-trace-url`'s template.
/// Its body runs in a process that exports spans (`exporting_test`): only
/// there do sessions have a trace id.
#[test]
fn a_session_links_its_trace_in_a_real_browser() {
    require_agent_tools();
    exporting_test(
        "console::trace::a_session_links_its_trace_in_a_real_browser",
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
