//! A request the service cannot decode is the caller's mistake, answered
//! `INVALID_ARGUMENT` with a clear message (never `INTERNAL`), on every
//! method; so is bad wire data. And a request field too long to echo back
//! still gets an answer, not a broken connection. The same holds for the
//! services the server serves besides its own: gRPC health and server
//! reflection (v1 and v1alpha).

use prost::Message as _;
use tonic::{Code, Status, transport::Channel};
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use troupe_tests::{
    OPERATOR_TOKEN, TestServer,
    raw::{NOT_UTF8, field, standard_bad_requests, streaming, unary},
    reason,
};

/// Each method of the session service, with a request whose only string is
/// not UTF-8 (the title of a root, the message of a send, ...).
fn not_utf8_requests() -> Vec<(&'static str, Vec<u8>)> {
    let service = |method| match method {
        "CreateRootSession" => "/troupe.session.v1.SessionService/CreateRootSession",
        "CreateSession" => "/troupe.session.v1.SessionService/CreateSession",
        "SendMessage" => "/troupe.session.v1.SessionService/SendMessage",
        "ListWorkspaceSessions" => "/troupe.session.v1.SessionService/ListWorkspaceSessions",
        "GetSession" => "/troupe.session.v1.SessionService/GetSession",
        "TerminateSession" => "/troupe.session.v1.SessionService/TerminateSession",
        "WatchSessions" => "/troupe.session.v1.SessionService/WatchSessions",
        "IssueSessionToken" => "/troupe.session.v1.SessionService/IssueSessionToken",
        "ListAudit" => "/troupe.session.v1.SessionService/ListAudit",
        "ReportProgress" => "/troupe.session.v1.SessionService/ReportProgress",
        other => panic!("no method {other}"),
    };
    let root = [field(1, b"alpha"), field(3, NOT_UTF8), field(4, b"worker")].concat();
    vec![
        (service("CreateRootSession"), root),
        (service("CreateSession"), field(1, NOT_UTF8)),
        (service("SendMessage"), field(2, NOT_UTF8)),
        (service("ListWorkspaceSessions"), field(1, NOT_UTF8)),
        (service("GetSession"), field(1, NOT_UTF8)),
        (service("TerminateSession"), field(2, NOT_UTF8)),
        (service("WatchSessions"), field(1, NOT_UTF8)),
        (service("IssueSessionToken"), field(1, NOT_UTF8)),
        (service("ListAudit"), field(1, NOT_UTF8)),
        (service("ReportProgress"), field(2, NOT_UTF8)),
    ]
}

async fn channel(server: &TestServer) -> Channel {
    troupe_proto::endpoint::connect(&format!("http://{}", server.addr))
        .await
        .expect("connect")
}

fn assert_invalid<T: std::fmt::Debug>(what: &str, answer: Result<T, Status>, says: &str) {
    let status = answer.expect_err(what);
    assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
    assert_eq!(reason(&status), "INVALID_ARGUMENT", "{what}: {status:?}");
    assert!(
        status
            .message()
            .starts_with("the request is not a valid message")
            && status.message().contains(says),
        "{what}: {}",
        status.message()
    );
}

#[tokio::test]
async fn a_string_that_is_not_utf8_is_invalid_argument_on_every_method() {
    let server = TestServer::start().await;
    let channel = channel(&server).await;
    for (path, body) in not_utf8_requests() {
        let answer = unary(channel.clone(), OPERATOR_TOKEN, path, body).await;
        assert_invalid(path, answer, "UTF-8");
    }
    // The same, well formed, is served.
    let root = [field(1, b"alpha"), field(3, b"title"), field(4, b"worker")].concat();
    unary(
        channel,
        OPERATOR_TOKEN,
        "/troupe.session.v1.SessionService/CreateRootSession",
        root,
    )
    .await
    .expect("a valid request is served");
    server.stop().await;
}

#[tokio::test]
async fn bad_wire_data_is_invalid_argument() {
    let server = TestServer::start().await;
    let channel = channel(&server).await;
    let get = "/troupe.session.v1.SessionService/GetSession";
    let mut truncated = field(1, b"sess_1");
    truncated.pop();
    // Field 1 as a varint: a string cannot be one.
    let wrong_type = vec![0x08, 0x01];
    for (what, body, says) in [
        ("truncated", truncated, "buffer underflow"),
        ("wrong wire type", wrong_type, "wire type"),
        ("no field number", vec![0x00], "invalid tag"),
    ] {
        let answer = unary(channel.clone(), OPERATOR_TOKEN, get, body).await;
        assert_invalid(what, answer, says);
    }
    server.stop().await;
}

#[tokio::test]
async fn bad_requests_to_health_and_reflection_are_invalid_argument() {
    let server = TestServer::start().await;
    let channel = channel(&server).await;
    for (path, body, says) in standard_bad_requests() {
        let answer = streaming(channel.clone(), OPERATOR_TOKEN, path, vec![body]).await;
        let what = format!("{path} ({says})");
        assert!(answer.messages.is_empty(), "{what}: {answer:?}");
        assert_invalid(&what, answer.end, says);
    }
    server.stop().await;
}

/// A reflection stream answers the requests it could decode, in order, and
/// ends with the refusal of the first it could not.
#[tokio::test]
async fn a_reflection_stream_answers_up_to_its_first_bad_request() {
    let server = TestServer::start().await;
    let channel = channel(&server).await;
    // `list_services` (field 7), then a host that is not UTF-8.
    let list = field(7, b"");
    for path in [
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    ] {
        let bodies = vec![list.clone(), list.clone(), field(1, NOT_UTF8), list.clone()];
        let answer = streaming(channel.clone(), OPERATOR_TOKEN, path, bodies).await;
        assert_eq!(answer.messages.len(), 2, "{path}: {answer:?}");
        for message in &answer.messages {
            // v1alpha's messages are v1's, field for field.
            let response =
                tonic_reflection::pb::v1::ServerReflectionResponse::decode(message.as_slice())
                    .expect("a reflection response");
            let Some(MessageResponse::ListServicesResponse(list)) = response.message_response
            else {
                panic!("{path}: not a list: {response:?}")
            };
            assert!(
                list.service
                    .iter()
                    .any(|s| s.name == "troupe.session.v1.SessionService"),
                "{path}: {list:?}"
            );
        }
        assert_invalid(path, answer.end, "UTF-8");
        // Well formed, the same stream ends as it did.
        let bodies = vec![list.clone(), list.clone()];
        let answer = streaming(channel.clone(), OPERATOR_TOKEN, path, bodies).await;
        assert_eq!(answer.messages.len(), 2, "{path}: {answer:?}");
        answer.end.expect(path);
    }
    server.stop().await;
}

/// A refusal that names the request's value stays short enough to send:
/// a session id of 100 KB is not found, rather than a broken stream.
#[tokio::test]
async fn a_refusal_of_an_over_long_value_is_still_answered() {
    let server = TestServer::start().await;
    let mut operator = server.operator().await;
    let status = operator
        .get_session(troupe_tests::get("s".repeat(100_000)))
        .await
        .expect_err("no such session");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert_eq!(reason(&status), "SESSION_NOT_FOUND");
    assert!(status.message().len() <= 1024, "{}", status.message().len());
    server.stop().await;
}
