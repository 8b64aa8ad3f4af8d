//! What generic gRPC tooling relies on: health and server reflection (v1 and v1alpha).

use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use troupe_tests::TestServer;

#[tokio::test]
async fn health_and_reflection_are_served() {
    let server = TestServer::start().await;
    let channel = Channel::from_shared(format!("http://{}", server.addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let health = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: "troupe.session.v1.SessionService".into(),
        })
        .await
        .expect("health")
        .into_inner();
    assert_eq!(health.status, ServingStatus::Serving as i32);

    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = ServerReflectionClient::new(channel.clone())
        .server_reflection_info(tokio_stream::once(request))
        .await
        .expect("reflection v1")
        .into_inner();
    let Some(Ok(response)) = responses.next().await else {
        panic!("no reflection answer")
    };
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("not a list")
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(
        names.contains(&"troupe.session.v1.SessionService"),
        "{names:?}"
    );
    assert!(
        names.contains(&"troupe.runner.v1.RunnerService"),
        "the runner's protocol is published too: {names:?}"
    );

    use tonic_reflection::pb::v1alpha::{
        ServerReflectionRequest as AlphaRequest,
        server_reflection_client::ServerReflectionClient as AlphaClient,
        server_reflection_request::MessageRequest as AlphaMessage,
    };
    let request = AlphaRequest {
        host: String::new(),
        message_request: Some(AlphaMessage::ListServices(String::new())),
    };
    let mut responses = AlphaClient::new(channel)
        .server_reflection_info(tokio_stream::once(request))
        .await
        .expect("reflection v1alpha")
        .into_inner();
    assert!(responses.next().await.expect("answer").is_ok());
    server.stop().await;
}

/// What grpcurl's `describe` asks: the file that defines a symbol (with
/// the files it imports, by name); an unknown symbol ends the stream
/// NOT_FOUND, after the answers before it.
#[tokio::test]
async fn reflection_describes_symbols_and_refuses_unknown_ones() {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let server = TestServer::start().await;
    let channel = troupe_proto::endpoint::connect(&format!("http://{}", server.addr))
        .await
        .expect("connect");
    let ask = |request| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let requests = vec![
        ask(MessageRequest::FileContainingSymbol(
            "troupe.session.v1.SessionService".into(),
        )),
        ask(MessageRequest::FileByFilename(
            "google/protobuf/timestamp.proto".into(),
        )),
        ask(MessageRequest::FileContainingSymbol(
            "no.such.Symbol".into(),
        )),
        ask(MessageRequest::ListServices(String::new())),
    ];
    let mut answers = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter(requests))
        .await
        .expect("reflection")
        .into_inner();
    for file in [
        "troupe/session/v1/session.proto",
        "google/protobuf/timestamp.proto",
    ] {
        let answer = answers.next().await.expect("an answer").expect(file);
        let Some(MessageResponse::FileDescriptorResponse(files)) = answer.message_response else {
            panic!("{file}: not a file: {answer:?}")
        };
        use prost::Message;
        let names: Vec<String> = files
            .file_descriptor_proto
            .iter()
            .map(|bytes| {
                prost_types::FileDescriptorProto::decode(bytes.as_slice())
                    .expect("a file descriptor")
                    .name()
                    .to_owned()
            })
            .collect();
        assert!(names.iter().any(|name| name == file), "{file}: {names:?}");
    }
    let status = answers
        .next()
        .await
        .expect("an answer")
        .expect_err("no such symbol");
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    assert!(answers.next().await.is_none(), "the stream ended");
    server.stop().await;
}

#[tokio::test]
async fn the_unix_socket_serves_the_same_rules() {
    use troupe_proto::session::{
        self as pb, TrustLevel, session_service_client::SessionServiceClient,
    };
    let server = TestServer::start().await;
    let (root, _, token) = server.root("sock", TrustLevel::Sandboxed).await;
    let socket = server.config.socket().expect("socket on by default");
    let endpoint = format!("unix://{}", socket.display());
    let channel = troupe_proto::endpoint::connect(&endpoint)
        .await
        .expect("connect over the socket");

    let mut agent = SessionServiceClient::with_interceptor(
        channel.clone(),
        troupe_tests::Bearer::new(Some(&token)).unwrap(),
    );
    let listed = agent
        .list_workspace_sessions(pb::ListWorkspaceSessionsRequest::default())
        .await
        .expect("list over the socket")
        .into_inner();
    assert_eq!(listed.sessions[0].session_id, root.session_id);

    let mut anonymous =
        SessionServiceClient::with_interceptor(channel, troupe_tests::Bearer::new(None).unwrap());
    let status = anonymous
        .list_workspace_sessions(pb::ListWorkspaceSessionsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);

    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o777,
        0o666,
        "agents of any uid must be able to connect"
    );
}

/// Text names the trust levels as aliases too (`trusted`, `untrusted`):
/// the descriptors reflection serves carry them, so tools that build JSON
/// from them (grpcurl) accept `TRUST_LEVEL_TRUSTED` and
/// `TRUST_LEVEL_UNTRUSTED`, and the levels they stand for are the same.
#[test]
fn the_trust_level_aliases_are_in_the_served_descriptors() {
    use prost::Message;
    let set = prost_types::FileDescriptorSet::decode(troupe_proto::FILE_DESCRIPTOR_SET)
        .expect("descriptors");
    let levels = set
        .file
        .iter()
        .flat_map(|f| &f.enum_type)
        .find(|e| e.name() == "TrustLevel")
        .expect("TrustLevel");
    let number = |name: &str| {
        levels
            .value
            .iter()
            .find(|v| v.name() == name)
            .map(|v| v.number())
    };
    assert_eq!(number("TRUST_LEVEL_TRUSTED"), number("TRUST_LEVEL_DIRECT"));
    assert_eq!(
        number("TRUST_LEVEL_UNTRUSTED"),
        number("TRUST_LEVEL_SANDBOXED")
    );
    assert!(number("TRUST_LEVEL_TRUSTED").is_some());
}
