//! `RegisterRunner` (troupe.fleet.v1) on a real server: the operator's
//! token only, every bad field INVALID_ARGUMENT naming it, the embedded
//! runner's name not for taking, refusals audited; a good registration
//! renews without a new generation. `ListRunners`: the operator's only, by
//! name, a runner whose lease lapsed shown as no longer live.

use tonic::{Code, Status, service::interceptor::InterceptedService, transport::Channel};
use troupe_proto::{
    fleet::{
        ListRunnersRequest, RegisterRunnerRequest, Runner, fleet_service_client::FleetServiceClient,
    },
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

/// A client of the server's fleet service, with `token`.
async fn fleet_client(
    server: &TestServer,
    token: &str,
) -> FleetServiceClient<InterceptedService<Channel, Bearer>> {
    let channel = troupe_proto::endpoint::connect(&format!("http://{}", server.addr))
        .await
        .expect("connect");
    FleetServiceClient::with_interceptor(channel, Bearer::new(Some(token)).unwrap())
}

async fn register(
    server: &TestServer,
    token: &str,
    req: RegisterRunnerRequest,
) -> Result<u64, Status> {
    fleet_client(server, token)
        .await
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

async fn list(server: &TestServer, token: &str) -> Result<Vec<Runner>, Status> {
    fleet_client(server, token)
        .await
        .list_runners(ListRunnersRequest {})
        .await
        .map(|r| r.into_inner().runners)
}

#[tokio::test]
async fn runners_are_listed_to_the_operator_only_live_then_lapsed() {
    let server = TestServer::start().await;
    let (_, _, agent_token) = server.root("ws", TrustLevel::Direct).await;
    let refused = list(&server, &agent_token)
        .await
        .expect_err("an agent listed the runners");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert_eq!(reason(&refused), "OPERATOR_ONLY");

    let mut short = request("r-short", "http://127.0.0.1:7402", 2);
    short.lease_ttl_ms = 500;
    register(&server, OPERATOR_TOKEN, short).await.unwrap();
    register(
        &server,
        OPERATOR_TOKEN,
        request("r-long", "http://127.0.0.1:7401", 8),
    )
    .await
    .unwrap();
    let named = |runners: &[Runner], name: &str| {
        runners
            .iter()
            .find(|r| r.name == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} not listed: {runners:?}"))
    };
    let runners = list(&server, OPERATOR_TOKEN).await.unwrap();
    let long = named(&runners, "r-long");
    assert_eq!(
        (
            long.endpoint.as_str(),
            long.capacity,
            long.active,
            long.live,
            long.embedded
        ),
        ("http://127.0.0.1:7401", 8, 0, true, false),
        "{long:?}"
    );
    assert!(named(&runners, "r-short").live);
    let names: Vec<&str> = runners.iter().map(|r| r.name.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "listed by name");

    // The short lease lapses (the other is renewed); the list says so.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        register(
            &server,
            OPERATOR_TOKEN,
            request("r-long", "http://127.0.0.1:7401", 8),
        )
        .await
        .unwrap();
        let runners = list(&server, OPERATOR_TOKEN).await.unwrap();
        if !named(&runners, "r-short").live {
            assert!(named(&runners, "r-long").live, "{runners:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "r-short never lapsed: {runners:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
