//! A start whose caller goes away half-way (the session service that asked
//! was killed) still starts the exec: dropped with its call, it would leave
//! the id reserved with no exec, so that the next owner's start is told it
//! exists and its watch that it does not, and the session is failed as lost.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use tonic::Code;
use troupe_proto::runner::ListExecsRequest;

#[tokio::test]
async fn a_start_whose_caller_goes_away_still_starts_the_exec() {
    let runner = TestRunner::start().await;
    // A new workspace: this start makes its container, which takes a while.
    let ws = runner.workspace("cancelled");
    let request = start_request(&ws, "gone-1", &["sh", "-c", "echo started; sleep 30"]);
    let reservation = runner.config.state_dir().join("execs").join("gone-1.json");
    let mut caller = runner.client().await;
    let call = tokio::spawn(async move { caller.start_exec(request).await });

    // The caller goes away once the runner has taken the id.
    let deadline = Instant::now() + MINUTE;
    while !reservation.exists() {
        assert!(Instant::now() < deadline, "the start never reserved its id");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(
        !call.is_finished(),
        "the start answered before its caller went away: nothing was tried"
    );
    call.abort();

    let mut client = runner.client().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let execs = client
            .list_execs(ListExecsRequest::default())
            .await
            .expect("list")
            .into_inner()
            .execs;
        if execs.iter().any(|e| e.exec_id == "gone-1") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the exec of a start whose caller went away never came: its id is reserved for nothing"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_for_output(&mut client, "gone-1", "started").await;
    let again = client
        .start_exec(start_request(&ws, "gone-1", &["true"]))
        .await
        .expect_err("a second start of the id");
    assert_eq!(again.code(), Code::AlreadyExists);
}
