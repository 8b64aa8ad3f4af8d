//! The relay's connections: a bound on how many, a drain at a stop, and a
//! socket found again after a restart.

use super::*;

/// Past `--relay-max-connections`, a new connection is closed at once; the
/// ones within keep working, and a closed one makes room again.
#[tokio::test]
async fn connections_past_the_limit_are_closed_and_those_within_keep_working() {
    let pair = Pair::relayed(live, |c| c.relay_max_connections = 2).await;
    let socket = pair.relay_socket();
    let mut first = through(&socket, Some(OPERATOR_TOKEN)).await;
    let mut second = through(&socket, Some(OPERATOR_TOKEN)).await;
    first.list_audit(list()).await.expect("first");
    second.list_audit(list()).await.expect("second");

    let third = tokio::net::UnixStream::connect(&socket).await.unwrap();
    closed_at_once(third).await;
    first
        .list_audit(list())
        .await
        .expect("first, past the limit");
    second
        .list_audit(list())
        .await
        .expect("second, past the limit");

    drop(first);
    let deadline = tokio::time::Instant::now() + MINUTE;
    loop {
        if let Ok(mut again) =
            troupe_proto::endpoint::connect(&format!("unix://{}", socket.display()))
                .await
                .map(|c| {
                    SessionServiceClient::with_interceptor(
                        c,
                        Bearer::new(Some(OPERATOR_TOKEN)).unwrap(),
                    )
                })
            && again.list_audit(list()).await.is_ok()
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no room again after a relayed connection closed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    second.list_audit(list()).await.expect("second, at the end");
}

/// At a stop the relay stops accepting at once, open relays work on for the
/// drain time and are then closed; started again, the runner replaces the
/// stale socket at the same path, where an agent in the workspace's
/// existing container finds it.
#[tokio::test]
async fn the_relay_drains_at_a_stop_and_is_found_again_after_a_restart() {
    require_agent_tools();
    let mut pair = Pair::relayed(live, |c| c.shutdown_drain_ms = 3000).await;
    let ws = pair.runner.workspace("relay-restart");
    pair.agent_command(&ws, "lister", &["troupe-demo-agent"]);
    let list_plan = serde_json::json!({"list": true}).to_string();
    let before = pair.root(&ws, "lister", &list_plan).await;
    pair.wait_status(&before.session_id, SessionStatus::Completed)
        .await;

    let socket = pair.relay_socket();
    let mut open = through(&socket, Some(OPERATOR_TOKEN)).await;
    let idle = tokio::net::UnixStream::connect(&socket).await.unwrap();
    open.list_audit(list()).await.expect("before the stop");

    let during = async {
        let deadline = tokio::time::Instant::now() + MINUTE;
        while tokio::net::UnixStream::connect(&socket).await.is_ok() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the relay still accepts after the stop began"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        open.list_audit(list()).await
    };
    let ((), during) = tokio::join!(pair.runner.stop(), during);
    during.expect("an open relay works during the drain");
    ends(idle).await;

    let stale = std::fs::symlink_metadata(&socket).expect("the socket file is left");
    assert!(std::os::unix::fs::FileTypeExt::is_socket(
        &stale.file_type()
    ));
    pair.runner.start_again().await;
    through(&socket, Some(OPERATOR_TOKEN))
        .await
        .list_audit(list())
        .await
        .expect("through the new socket");
    let after = pair.root(&ws, "lister", &list_plan).await;
    let out = pair.completed_events(&after.session_id).await;
    assert!(out.iter().any(|e| e["event"] == "listed"), "{out:?}");
}
