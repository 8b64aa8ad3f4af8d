//! What the console's calls answer: the agents a workspace could run, a
//! trace link's form, a tree's snapshot.

use super::*;

#[tokio::test]
async fn the_agents_a_workspace_could_run_are_offered_from_the_database_and_files() {
    let (server, base) = console_server().await;
    server.write_agent(Some("alpha"), "reviewer");
    server.write_agent(None, "helper");
    let (cookie, _) = sign_in(&base).await;
    let answer = http::send(
        Method::GET,
        &format!("{base}/api/agents?workspace=alpha"),
        &[("cookie", cookie.as_str())],
        "",
        LIMIT,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let names: Vec<(String, String)> = answer.json()["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["workspace_id"].as_str().unwrap().to_owned(),
                a["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        names.contains(&("alpha".into(), "reviewer".into())),
        "{names:?}"
    );
    assert!(
        names.contains(&(String::new(), "helper".into())),
        "{names:?}"
    );
}

#[tokio::test]
async fn a_trace_url_that_is_not_an_http_link_with_the_trace_id_stops_the_start() {
    for url in [
        "javascript:alert(1)//{trace_id}",
        "http://jaeger:16686/trace/",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = troupe_session_svc::Config::with_data_dir(dir.path());
        config.console.console_listen = Some(free_addr());
        config.console.console_trace_url = Some(url.to_owned());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let served = tokio::time::timeout(
            LIMIT,
            troupe_session_svc::serve(config, listener, std::future::pending()),
        )
        .await
        .expect("refused at once");
        let err = served.expect_err(url).to_string();
        assert!(err.contains("--console-trace-url"), "{err}");
    }
}

#[tokio::test]
async fn a_tree_snapshot_carries_inbox_progress_and_refused_spawns() {
    use troupe_proto::session::{ReportProgressRequest, SendMessageRequest, TrustLevel};
    let (server, base) = console_server().await;
    let (root, mut agent, _) = server.root("alpha", TrustLevel::Sandboxed).await;
    let id = root.session_id.clone();
    let mut operator = server.operator().await;
    for n in 0..2 {
        operator
            .send_message(SendMessageRequest {
                session_id: id.clone(),
                message: format!("message {n}"),
                request_id: String::new(),
            })
            .await
            .unwrap();
    }
    agent
        .report_progress(ReportProgressRequest {
            progress: 40,
            description: "half way".to_owned(),
        })
        .await
        .unwrap();
    let refused = troupe_proto::session::CreateSessionRequest {
        agent_name: "nobody".to_owned(),
        ..troupe_tests::child("refused")
    };
    agent
        .create_session(refused)
        .await
        .expect_err("no such agent");

    let (cookie, _) = sign_in(&base).await;
    let cookie = ("cookie", cookie.as_str());
    let snapshot = http::send(
        Method::GET,
        &format!("{base}/api/workspaces/alpha/sessions"),
        &[cookie],
        "",
        LIMIT,
    )
    .await;
    assert_eq!(snapshot.status, StatusCode::OK, "{}", snapshot.body);
    let snapshot = snapshot.json();
    let node = snapshot["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["session_id"] == id.as_str())
        .expect("the root")
        .clone();
    // No runner here: the initial message and the two stay unread.
    assert_eq!(
        node["inbox"],
        json!({"received": 3, "delivered_through": 0, "unread": 3})
    );
    assert_eq!(
        node["progress"],
        json!({"progress": 40, "description": "half way"})
    );
    assert!(troupe_tests::position(snapshot["cursor"].as_str().unwrap(), "alpha") > 0);
    let refusals = snapshot["refused"].as_array().unwrap();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert_eq!(refusals[0]["target"], id.as_str());
    // The page follows refusals from the cursor it was given: none new.
    let after = snapshot["audit_cursor"].as_u64().unwrap();
    let follow = http::send(
        Method::GET,
        &format!("{base}/api/refused?workspace=alpha&after={after}"),
        &[cookie],
        "",
        LIMIT,
    )
    .await;
    assert_eq!(follow.status, StatusCode::OK, "{}", follow.body);
    assert_eq!(follow.json()["refused"], json!([]));
    let unnamed = http::send(
        Method::GET,
        &format!("{base}/api/refused?after={after}"),
        &[cookie],
        "",
        LIMIT,
    )
    .await;
    assert_eq!(unnamed.status, StatusCode::BAD_REQUEST, "{}", unnamed.body);
    assert_eq!(unnamed.json()["code"], "INVALID_ARGUMENT");
    let view = http::send(
        Method::GET,
        &format!("{base}/api/sessions/{id}"),
        &[cookie],
        "",
        LIMIT,
    )
    .await;
    assert_eq!(view.json()["unread_count"], 3);
}
