//! Requests the runner refuses: malformed ones, a second start, stdin of an
//! unknown exec, calls without the operator token, and a missing image
//! named in the error.

use super::*;

#[tokio::test]
async fn bad_requests_are_refused() {
    let runner = TestRunner::start().await;
    let ws = runner.workspace("bad");
    let mut client = runner.client().await;
    let cases: Vec<(StartExecRequest, Code)> = vec![
        (start_request(&ws, "../x", &["true"]), Code::InvalidArgument),
        (
            start_request("../etc", "x1", &["true"]),
            Code::InvalidArgument,
        ),
        (start_request(&ws, "x2", &[]), Code::InvalidArgument),
        (
            {
                let mut r = start_request(&ws, "x3", &["true"]);
                r.env.insert("A=B".into(), "c".into());
                r
            },
            Code::InvalidArgument,
        ),
    ];
    for (req, code) in cases {
        let status = client.start_exec(req.clone()).await.unwrap_err();
        assert_eq!(status.code(), code, "{req:?}: {status:?}");
    }
    runner.sh(&ws, "once", "true").await;
    let status = client
        .start_exec(start_request(&ws, "once", &["true"]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists);
    let status = client
        .write_stdin(WriteStdinRequest {
            exec_id: "nope".into(),
            data: vec![],
            close: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);

    // Without the operator token nothing runs.
    let mut anonymous = troupe_proto::runner::runner_service_client::RunnerServiceClient::new(
        runner.channel().await,
    );
    let status = anonymous
        .start_exec(start_request(&ws, "anon", &["true"]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
}

#[tokio::test]
async fn a_missing_image_is_named_in_the_error() {
    let runner = TestRunner::start_with(|c| c.image = "troupe-no-such-image:none".into()).await;
    let ws = runner.workspace("noimage");
    let status = runner
        .client()
        .await
        .start_exec(start_request(&ws, "x", &["true"]))
        .await
        .unwrap_err();
    assert!(
        status.message().contains("troupe-no-such-image:none")
            && status.message().contains("scripts/build-image"),
        "{status:?}"
    );
}
