//! A session's messages across an owner change, on PostgreSQL with two
//! real `troupe-session` replicas and one real runner (run under
//! `scripts/pg-env`; the binary comes from `cargo build -p
//! troupe-session-svc`): the owner dies after the runner accepted the
//! agent's start (its first message with it), or a later message, and
//! before it recorded their delivery. The next owner finds the exec and delivers from the store's
//! record, which says nothing was delivered; the runner, which knows what
//! reached stdin, writes nothing twice. And a start told its exec exists
//! (started earlier, with fewer messages) loses none of the rest.

mod common;

use std::time::Duration;

use common::{
    MINUTE, TestRunner,
    replicas::{output, replica, status, until},
};
use sqlx::{Connection, PgConnection};
use troupe_proto::{
    runner::{ExecState, ListExecsRequest, StdinFrame},
    session::{CreateRootSessionRequest, DeliveryStatus, SessionStatus, TrustLevel},
};
use troupe_session_svc::store::{PgStore, Store};
use troupe_tests::OPERATOR_TOKEN;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_message_written_before_its_owner_died_is_not_written_again() {
    let url = troupe_tests::postgres::fresh_database().await;
    // The runner comes up only once the test holds the delivery's rows:
    // until then the owner's start is refused (UNAVAILABLE) and retried.
    let addr = troupe_tests::ports::free_addr();
    let endpoint = format!("http://{addr}");
    let store = PgStore::open(&url).await.unwrap();
    let mut first = replica(&url, &endpoint);
    let held = until("nobody took the lease", MINUTE, || async {
        store.lease().await.unwrap().filter(|l| l.live)
    })
    .await;
    let second = replica(&url, &endpoint);
    let mut via_second = second.operator().await;
    let root = via_second
        .create_root_session(CreateRootSessionRequest {
            workspace_id: "stdin-takeover".into(),
            trust_level: TrustLevel::Direct as i32,
            title: "root".into(),
            agent_name: "echo".into(),
            initial_message: "the-plan".into(),
            request_id: String::new(),
            budget: None,
            writable_paths: Vec::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap()
        .session_id;

    // `mark_delivered` updates the message's row: held, the owner's record
    // of the delivery waits after the runner has the start.
    let mut holder = PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("SELECT seq FROM messages WHERE session_id = $1 FOR UPDATE")
        .bind(&root)
        .fetch_all(&mut holder)
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let runner = TestRunner::start_on(listener, |c| {
        c.operator_token = Some(OPERATOR_TOKEN.into());
    })
    .await;
    let runner_client = runner.client().await;
    until("the runner never started the agent", MINUTE, || {
        let mut client = runner_client.clone();
        let root = root.clone();
        async move {
            let execs = client
                .list_execs(ListExecsRequest::default())
                .await
                .unwrap()
                .into_inner()
                .execs;
            execs
                .iter()
                .find(|e| e.exec_id == root)
                .and_then(|e| (e.stdin_sequence == 1).then_some(()))
        }
    })
    .await;
    let watcher = sqlx::PgPool::connect(&url).await.unwrap();
    until(
        "the owner never waited to record the delivery",
        MINUTE,
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(&watcher)
            .await
            .unwrap();
            (waiting > 0).then_some(())
        },
    )
    .await;
    first.kill();
    assert!(
        first.exited_within(Duration::from_secs(10)).await.is_some(),
        "the owner outlived SIGKILL"
    );
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut holder)
        .await
        .unwrap();

    until("nobody took over", MINUTE, || async {
        store
            .lease()
            .await
            .unwrap()
            .filter(|l| l.live && l.epoch > held.epoch)
    })
    .await;
    // The new owner records what the runner says reached stdin.
    until("the delivery was never recorded", MINUTE, || async {
        let process = store.process(&root.as_str().into()).await.unwrap()?;
        (process.delivered_seq >= 1).then_some(())
    })
    .await;
    // Stdin is written in order: a repeat of the first message would be
    // echoed before this one.
    via_second
        .send_message(troupe_tests::message(&root, "the-next"))
        .await
        .unwrap();
    let out = until("the next message never came back", MINUTE, || async {
        let out = output(&store, &root).await;
        out.contains("the-next").then_some(out)
    })
    .await;
    assert_eq!(out.matches("the-plan").count(), 1, "{out}");
    assert_eq!(out.matches("the-next").count(), 1, "{out}");
    via_second
        .terminate_session(troupe_tests::terminate(&root))
        .await
        .unwrap();
    assert!(second.stop().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_written_before_its_owner_died_is_not_written_again() {
    let url = troupe_tests::postgres::fresh_database().await;
    let runner = TestRunner::start_with(|c| {
        c.operator_token = Some(OPERATOR_TOKEN.into());
    })
    .await;
    let endpoint = format!("http://{}", runner.addr);
    let store = PgStore::open(&url).await.unwrap();
    let mut first = replica(&url, &endpoint);
    let held = until("nobody took the lease", MINUTE, || async {
        store.lease().await.unwrap().filter(|l| l.live)
    })
    .await;
    let second = replica(&url, &endpoint);
    let mut via_first = first.operator().await;
    let mut via_second = second.operator().await;
    let root = via_first
        .create_root_session(CreateRootSessionRequest {
            workspace_id: "stdin-write".into(),
            trust_level: TrustLevel::Direct as i32,
            title: "root".into(),
            agent_name: "echo".into(),
            initial_message: "the-plan".into(),
            request_id: String::new(),
            budget: None,
            writable_paths: Vec::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap()
        .session_id;
    // Running, its first message delivered and echoed: the next is
    // written to it at once.
    until("the first message never came back", MINUTE, || async {
        let process = store.process(&root.as_str().into()).await.unwrap()?;
        (process.delivered_seq == 1 && output(&store, &root).await.contains("the-plan"))
            .then_some(())
    })
    .await;
    until("the session never ran", MINUTE, || {
        let mut client = via_second.clone();
        let root = root.clone();
        async move { (status(&mut client, &root).await == SessionStatus::Running).then_some(()) }
    })
    .await;

    // `mark_delivered` updates the session's process row first: held, the
    // owner's record of the next delivery waits after the runner has it.
    let mut holder = PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("SELECT 1 FROM processes WHERE session_id = $1 FOR UPDATE")
        .bind(&root)
        .fetch_all(&mut holder)
        .await
        .unwrap();
    // Sent through the owner, which writes it to the agent before it
    // answers; its record of that cannot commit while the row is held.
    let sent = via_first
        .send_message(troupe_tests::message(&root, "the-second"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(sent.delivery(), DeliveryStatus::Delivered);
    first.kill();
    assert!(
        first.exited_within(Duration::from_secs(10)).await.is_some(),
        "the owner outlived SIGKILL"
    );
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut holder)
        .await
        .unwrap();

    until("nobody took over", MINUTE, || async {
        store
            .lease()
            .await
            .unwrap()
            .filter(|l| l.live && l.epoch > held.epoch)
    })
    .await;
    until("the delivery was never recorded", MINUTE, || async {
        let process = store.process(&root.as_str().into()).await.unwrap()?;
        (process.delivered_seq >= 2).then_some(())
    })
    .await;
    via_second
        .send_message(troupe_tests::message(&root, "the-third"))
        .await
        .unwrap();
    let out = until("the third message never came back", MINUTE, || async {
        let out = output(&store, &root).await;
        out.contains("the-third").then_some(out)
    })
    .await;
    assert_eq!(out.matches("the-plan").count(), 1, "{out}");
    assert_eq!(out.matches("the-second").count(), 1, "{out}");
    via_second
        .terminate_session(troupe_tests::terminate(&root))
        .await
        .unwrap();
    assert!(second.stop().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_finds_its_exec_started_with_fewer_messages_loses_none() {
    let url = troupe_tests::postgres::fresh_database().await;
    let runner = TestRunner::start_with(|c| {
        c.operator_token = Some(OPERATOR_TOKEN.into());
    })
    .await;
    let mut runner_client = runner.client().await;
    let workspace = "stdin-started";
    // An exec no session has: the owner's one reconciliation of the runner
    // (per term) stops it, which tells the test that it is over, so that
    // the session below is started by its launch, not followed.
    runner_client
        .start_exec(common::start_request(
            workspace,
            "orphan",
            &["sleep", "600"],
        ))
        .await
        .unwrap();
    let store = PgStore::open(&url).await.unwrap();
    let owner = replica(&url, &format!("http://{}", runner.addr));
    until("the runner was never reconciled", MINUTE, || {
        let mut client = runner_client.clone();
        async move {
            let execs = client
                .list_execs(ListExecsRequest::default())
                .await
                .unwrap()
                .into_inner()
                .execs;
            execs
                .iter()
                .any(|e| e.exec_id == "orphan" && e.state() == ExecState::Exited)
                .then_some(())
        }
    })
    .await;

    // The placement writes `workspace_runner`: held, the owner's launch
    // waits before it reads the session's inbox.
    let mut holder = PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql("BEGIN; LOCK TABLE workspace_runner IN SHARE MODE")
        .execute(&mut holder)
        .await
        .unwrap();
    let mut client = owner.operator().await;
    let root = client
        .create_root_session(CreateRootSessionRequest {
            workspace_id: workspace.into(),
            trust_level: TrustLevel::Direct as i32,
            title: "root".into(),
            agent_name: "echo".into(),
            initial_message: "the-plan".into(),
            request_id: String::new(),
            budget: None,
            writable_paths: Vec::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap()
        .session_id;
    let watcher = sqlx::PgPool::connect(&url).await.unwrap();
    until(
        "the launch never waited on its placement",
        MINUTE,
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND query LIKE '%INTO workspace_runner%'",
            )
            .fetch_one(&watcher)
            .await
            .unwrap();
            (waiting > 0).then_some(())
        },
    )
    .await;
    // Stored before the launch reads the inbox: its start gives both.
    client
        .send_message(troupe_tests::message(&root, "the-second"))
        .await
        .unwrap();
    // An earlier start of the exec, given message 1 only (as by an owner
    // before this one): the launch's start is told the exec exists.
    let mut start = common::start_request(workspace, &root, &["cat"]);
    start.initial_frames = vec![StdinFrame {
        sequence: 1,
        data: b"earlier-start\n".to_vec(),
    }];
    runner_client.start_exec(start).await.unwrap();
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut holder)
        .await
        .unwrap();

    until("the session never ran", MINUTE, || {
        let mut client = client.clone();
        let root = root.clone();
        async move { (status(&mut client, &root).await == SessionStatus::Running).then_some(()) }
    })
    .await;
    // Stdin is written in order: the second message, if written, is
    // echoed before this one.
    client
        .send_message(troupe_tests::message(&root, "the-third"))
        .await
        .unwrap();
    let out = until("the third message never came back", MINUTE, || async {
        let out = output(&store, &root).await;
        out.contains("the-third").then_some(out)
    })
    .await;
    assert_eq!(out.matches("earlier-start").count(), 1, "{out}");
    assert_eq!(out.matches("the-plan").count(), 0, "{out}");
    assert_eq!(out.matches("the-second").count(), 1, "{out}");
    client
        .terminate_session(troupe_tests::terminate(&root))
        .await
        .unwrap();
    assert!(owner.stop().await);
}
