//! Stdin closed before the plan, or during a wait: an error, said so.

use super::*;

#[tokio::test]
async fn stdin_closed_before_the_plan_or_during_a_wait_is_an_error() {
    let agent = Agent::start(None, None).await;
    let run = agent.finish(true).await;
    assert_eq!(run.code, Some(2));
    assert_eq!(run.names(), ["error"]);
    assert!(text_of(run.one("error")).contains("before the plan"));

    // Text that is not a JSON object is said; no bridge is needed for that.
    let mut agent = Agent::start(None, None).await;
    agent.write("operator", "just saying").await;
    let run = agent.finish(true).await;
    assert_eq!(run.code, Some(0));
    assert_eq!(run.names(), ["say", "done"]);
    assert_eq!(text_of(run.one("say")), "just saying");

    let mut agent = Agent::start(None, None).await;
    agent.write("operator", r#"{"wait_messages": 2}"#).await;
    agent.write("operator", "one").await;
    let run = agent.finish(true).await;
    assert_eq!(run.code, Some(1));
    assert_eq!(run.names(), ["message", "error"]);
    assert!(text_of(run.one("error")).contains("after 1 of the 2 messages"));

    let mut agent = Agent::start(None, None).await;
    agent.write("operator", r#"{"spwan": []}"#).await;
    let run = agent.finish(true).await;
    assert_eq!(
        run.code,
        Some(2),
        "a plan with unknown fields: {:#?}",
        run.events
    );
    assert!(text_of(run.one("error")).contains("not valid"));
}
