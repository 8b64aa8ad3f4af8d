//! A team's life in the console, in one real browser going through the
//! steps in turn (each defined in its concern's file); a failed step keeps
//! a screenshot (`troupe_tests::browser`).

use super::*;

/// The talker prints this (and colours), then echoes each stdin line.
const TALKER: &str = "printf 'hello \\033[31mred\\033[0m world\\n'; \
    echo '<script>window.__xss=\"output\"</script><img src=x onerror=\"window.__xss=1\">'; \
    while read line; do echo \"got: $line\"; done";

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
        .step("sign_in", sign_in::signs_in(&browser, &base, &ws))
        .await;
    browser
        .step(
            "tree_grows_live",
            live::tree_grows_live(&browser, &base, &ws, &pair),
        )
        .await;
    let mut talker = String::new();
    browser
        .step("output_streams", async {
            talker = sessions::output_streams(&browser, &base, &ws).await?;
            Ok(())
        })
        .await;
    browser
        .step("message_delivered", sessions::message_delivered(&browser))
        .await;
    browser
        .step(
            "agent_text_stays_text_in_the_tree",
            sessions::agent_text_stays_text_in_the_tree(&browser, &base, &ws),
        )
        .await;
    browser
        .step(
            "refused_without_cookie_or_csrf",
            sign_in::refused_without_cookie_or_csrf(&base, &talker),
        )
        .await;
    browser
        .step(
            "resumes_after_a_restart",
            live::resumes_after_a_restart(&browser, &base, &talker, &mut pair),
        )
        .await;
    browser
        .step(
            "repeated_events_show_once",
            live::repeated_events_show_once(&browser, &base, &talker),
        )
        .await;
    browser
        .step(
            "terminate_subtree",
            sessions::terminate_subtree(&browser, &base, &ws, &pair),
        )
        .await;
    browser
        .step(
            "unread_counts_live",
            live::unread_counts_live(&browser, &base, &ws, &mut pair),
        )
        .await;
    browser
        .step(
            "snapshot_counts_are_not_counted_again",
            live::snapshot_counts_are_not_counted_again(&browser),
        )
        .await;
    browser
        .step("sign_out", sign_in::signs_out(&browser, &base))
        .await;
    browser.close().await;
}
