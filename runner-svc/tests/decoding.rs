//! A request the runner cannot decode is answered `INVALID_ARGUMENT` with a
//! clear message, never `INTERNAL`, on every method: the runner's own and
//! those of gRPC health and server reflection (v1 and v1alpha).

use crate::common;

use common::{TOKEN, TestRunner};
use tonic::Code;
use troupe_tests::raw::{field, standard_bad_requests, streaming, unary};

#[tokio::test]
async fn a_string_that_is_not_utf8_is_invalid_argument_on_every_method() {
    let runner = TestRunner::start().await;
    let channel = troupe_proto::endpoint::connect(&format!("http://{}", runner.addr))
        .await
        .expect("connect");
    let not_utf8: &[u8] = b"\xff\xfe";
    for (path, body) in [
        (
            "/troupe.runner.v1.RunnerService/StartExec",
            [field(1, not_utf8), field(2, b"exec")].concat(),
        ),
        (
            "/troupe.runner.v1.RunnerService/WatchExec",
            field(1, not_utf8),
        ),
        (
            "/troupe.runner.v1.RunnerService/WriteStdin",
            field(1, not_utf8),
        ),
        (
            "/troupe.runner.v1.RunnerService/TerminateExec",
            field(1, not_utf8),
        ),
        (
            "/troupe.runner.v1.RunnerService/ListExecs",
            field(1, not_utf8),
        ),
    ] {
        let status = unary(channel.clone(), TOKEN, path, body)
            .await
            .expect_err(path);
        assert_eq!(status.code(), Code::InvalidArgument, "{path}: {status:?}");
        assert!(
            status.message().contains("not UTF-8"),
            "{path}: {}",
            status.message()
        );
    }
}

#[tokio::test]
async fn bad_requests_to_health_and_reflection_are_invalid_argument() {
    let runner = TestRunner::start().await;
    let channel = troupe_proto::endpoint::connect(&format!("http://{}", runner.addr))
        .await
        .expect("connect");
    for (path, body, says) in standard_bad_requests() {
        let answer = streaming(channel.clone(), TOKEN, path, vec![body]).await;
        let what = format!("{path} ({says})");
        assert!(answer.messages.is_empty(), "{what}: {answer:?}");
        let status = answer.end.expect_err(&what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert!(
            status
                .message()
                .starts_with("the request is not a valid message")
                && status.message().contains(says),
            "{what}: {}",
            status.message()
        );
    }
}
