//! What replicas share instead of reading it from their own disk: agent
//! definitions applied through one are used by creates on another, and
//! replicas started with no operator token of their own all hold the first
//! one's.

use std::time::{Duration, Instant};

use futures::future::join_all;
use troupe_proto::session::{ApplyAgentRequest, ListAgentsRequest, RemoveAgentRequest, TrustLevel};
use troupe_tests::{TestServer, agent_definition, postgres::Backend};

use super::{replicas, stop_all, unlimited};

#[tokio::test]
async fn a_definition_applied_through_one_replica_is_used_by_a_create_on_another() {
    let servers = replicas(2, unlimited()).await;
    servers[0]
        .operator()
        .await
        .apply_agent(ApplyAgentRequest {
            workspace_id: "alpha".into(),
            name: "worker".into(),
            definition: agent_definition("worker", &["/bin/echo", "shared"]),
        })
        .await
        .expect("apply on the first replica");
    let listed = servers[1]
        .operator()
        .await
        .list_agents(ListAgentsRequest::default())
        .await
        .expect("list on the second")
        .into_inner()
        .agents;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let (made, _, _) = servers[1].root("alpha", TrustLevel::Direct).await;
    assert_eq!(
        servers[1].stored_command(&made.session_id).await,
        ["/bin/echo", "shared"]
    );

    // Removed through the second, the first falls back to the file.
    servers[1]
        .operator()
        .await
        .remove_agent(RemoveAgentRequest {
            workspace_id: "alpha".into(),
            name: "worker".into(),
        })
        .await
        .expect("remove on the second replica");
    let (back, _, _) = servers[0].root("alpha", TrustLevel::Direct).await;
    assert_eq!(
        servers[0].stored_command(&back.session_id).await,
        ["/bin/cat"]
    );
    stop_all(servers).await;
}

#[tokio::test]
async fn replicas_without_a_token_of_their_own_all_hold_the_first_ones() {
    let first = TestServer::start_on(Backend::Postgres, |c| c.operator_token = None).await;
    let others = join_all((0..3).map(|_| first.replica())).await;
    let token = token_file(&first).await;
    for other in &others {
        assert_eq!(token_file(other).await, token);
    }
    let mut all = vec![first];
    all.extend(others);
    stop_all(all).await;
}

/// The token in a server's token file, once it is there.
async fn token_file(server: &TestServer) -> String {
    let path = server.config.data_dir.join("operator.token");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match std::fs::read_to_string(&path) {
            Ok(text) if !text.trim().is_empty() => return text.trim().to_owned(),
            _ => assert!(
                Instant::now() < deadline,
                "no token file at {}",
                path.display()
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
