//! `troupe session get` of a session that finished its task: the text view
//! shows its outcome and result, escaped for the terminal; `--json` gives
//! them as `finished`.

use std::process::Command;

use serde_json::Value;
use troupe_proto::session::{FinishSessionRequest, Outcome, TrustLevel};
use troupe_tests::{OPERATOR_TOKEN, TestServer};

const TROUPE: &str = env!("CARGO_BIN_EXE_troupe");

async fn get(server: &TestServer, args: &[&str]) -> String {
    let mut command = Command::new(TROUPE);
    command
        .env("TROUPE_ENDPOINT", format!("http://{}", server.addr))
        .env("TROUPE_OPERATOR_TOKEN", OPERATOR_TOKEN)
        .env_remove("TROUPE_TOKEN")
        .args(args);
    let output = tokio::task::spawn_blocking(move || command.output().expect("troupe runs"))
        .await
        .expect("joined");
    assert!(
        output.status.success(),
        "troupe {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_finished_sessions_outcome_and_result_are_shown_escaped() {
    let server = TestServer::start().await;
    let (session, mut agent, _) = server.root("ws", TrustLevel::Direct).await;
    let result = "the answer is 42\n\u{1b}[31mred\u{1b}[0m and done";
    agent
        .finish_session(FinishSessionRequest {
            result: result.to_owned(),
            outcome: Outcome::Failure as i32,
        })
        .await
        .expect("finish");

    let text = get(&server, &["session", "get", &session.session_id]).await;
    assert!(text.contains("outcome     failure\n"), "{text}");
    let shown = text.split_once("result:\n").expect(&text).1;
    assert!(shown.starts_with("the answer is 42\n"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "a raw escape reached the terminal: {text:?}"
    );
    assert!(shown.contains("red"), "{text}");

    let json: Value = serde_json::from_str(
        &get(&server, &["--json", "session", "get", &session.session_id]).await,
    )
    .expect("JSON");
    assert_eq!(json["finished"]["outcome"], "failure");
    assert_eq!(json["finished"]["result"], result);
}
