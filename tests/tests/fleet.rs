//! `RegisterRunner` (troupe.fleet.v1) on a real server: the operator's
//! token only, every bad field INVALID_ARGUMENT naming it, the embedded
//! runner's name not for taking, refusals audited; a good registration
//! renews without a new generation.

use tonic::{Code, Status};
use troupe_proto::{
    fleet::{RegisterRunnerRequest, fleet_service_client::FleetServiceClient},
    session::{ListAuditRequest, TrustLevel},
};
use troupe_tests::{Bearer, OPERATOR_TOKEN, TestServer, reason};

fn request(name: &str, endpoint: &str, capacity: u32) -> RegisterRunnerRequest {
    RegisterRunnerRequest {
        name: name.to_owned(),
        endpoint: endpoint.to_owned(),
        capacity,
        lease_ttl_ms: 3000,
    }
}

async fn register(
    server: &TestServer,
    token: &str,
    req: RegisterRunnerRequest,
) -> Result<u64, Status> {
    let channel = troupe_proto::endpoint::connect(&format!("http://{}", server.addr))
        .await
        .expect("connect");
    let mut client =
        FleetServiceClient::with_interceptor(channel, Bearer::new(Some(token)).unwrap());
    client
        .register_runner(req)
        .await
        .map(|r| r.into_inner().generation)
}

#[tokio::test]
async fn registration_needs_the_operator_token() {
    let server = TestServer::start().await;
    let (_, _, agent_token) = server.root("ws", TrustLevel::Direct).await;
    let refused = register(
        &server,
        &agent_token,
        request("r1", "http://127.0.0.1:7401", 4),
    )
    .await
    .expect_err("an agent registered a runner");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert_eq!(reason(&refused), "OPERATOR_ONLY");
    let unknown = register(
        &server,
        "not-a-token",
        request("r1", "http://127.0.0.1:7401", 4),
    )
    .await
    .expect_err("a bad token registered a runner");
    assert_eq!(unknown.code(), Code::Unauthenticated, "{unknown:?}");
    let audit = server
        .operator()
        .await
        .list_audit(ListAuditRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert!(
        audit
            .iter()
            .any(|e| e.action == "register_runner" && !e.allowed && e.reason == "OPERATOR_ONLY"),
        "{audit:?}"
    );
    // The operator's passes, and renewing keeps the generation.
    let first = register(
        &server,
        OPERATOR_TOKEN,
        request("r1", "http://127.0.0.1:7401", 4),
    )
    .await
    .expect("operator registers");
    let again = register(
        &server,
        OPERATOR_TOKEN,
        request("r1", "http://127.0.0.1:7401", 4),
    )
    .await
    .expect("operator renews");
    assert_eq!(first, again);
    let moved = register(
        &server,
        OPERATOR_TOKEN,
        request("r1", "http://127.0.0.1:7402", 4),
    )
    .await
    .expect("operator moves it");
    assert_eq!(moved, first + 1, "a new endpoint is a new generation");
}

#[tokio::test]
async fn bad_registrations_are_invalid_arguments_naming_the_field() {
    let server = TestServer::start().await;
    let mut ttl_zero = request("r1", "http://127.0.0.1:7401", 4);
    ttl_zero.lease_ttl_ms = 0;
    for (req, field) in [
        (request("not a slug", "http://127.0.0.1:7401", 4), "name"),
        (request("", "http://127.0.0.1:7401", 4), "name"),
        (request("default", "http://127.0.0.1:7401", 4), "name"),
        (request("r1", "127.0.0.1:7401", 4), "endpoint"),
        (request("r1", "not a url", 4), "endpoint"),
        (request("r1", "unix://relative", 4), "endpoint"),
        (request("r1", "http://127.0.0.1:7401", 0), "capacity"),
        (ttl_zero, "lease_ttl_ms"),
    ] {
        let refused = register(&server, OPERATOR_TOKEN, req.clone())
            .await
            .expect_err("a bad registration passed");
        assert_eq!(
            refused.code(),
            Code::InvalidArgument,
            "{req:?}: {refused:?}"
        );
        assert_eq!(reason(&refused), "INVALID_ARGUMENT", "{req:?}");
        assert_eq!(
            troupe_tests::error_metadata(&refused, "field").as_deref(),
            Some(field),
            "{req:?}: {refused:?}"
        );
    }
}
