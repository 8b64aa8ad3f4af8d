//! A session's messages across an owner change, on PostgreSQL with two
//! real `troupe-session` replicas and one real runner (run under
//! `scripts/pg-env`; the binary comes from `cargo build -p
//! troupe-session-svc`): the owner dies after the runner accepted the
//! agent's start (its first message with it), or a later message, and
//! before it recorded their delivery. The next owner finds the exec and delivers from the store's
//! record, which says nothing was delivered; the runner, which knows what
//! reached stdin, writes nothing twice. And a start told its exec exists
//! (started earlier, with fewer messages) loses none of the rest.

use crate::common;

use common::{
    MINUTE, TestRunner, direct_root, list_execs,
    replicas::{
        Holder, balanced, end_and_stop, kill_replica, output, replica, send_until_echoed,
        shard_lease, taken_over, until, until_delivered, until_lock_wait, until_running,
    },
};
use troupe_proto::runner::{ExecState, StdinFrame};
use troupe_proto::session::DeliveryStatus;
use troupe_session_svc::store::{PgStore, prelude::*};
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
    balanced(&store, 1).await;
    let second = replica(&url, &endpoint);
    balanced(&store, 2).await;
    // A workspace of the low shards, which the first replica keeps.
    let workspace = "stdin-takeover-1";
    let held = shard_lease(&store, workspace).await;
    assert_eq!(held.holder.pid(), Some(first.pid()), "the first keeps it");
    let mut via_second = second.operator().await;
    let root = direct_root(&mut via_second, workspace, "echo", "the-plan")
        .await
        .session_id;

    // `mark_delivered` updates the message's row: held, the owner's record
    // of the delivery waits after the runner has the start.
    let holder = Holder::rows(
        &url,
        "SELECT seq FROM messages WHERE session_id = $1 FOR UPDATE",
        &root,
    )
    .await;
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
            list_execs(&mut client)
                .await
                .iter()
                .find(|e| e.exec_id == root)
                .and_then(|e| (e.stdin_sequence == 1).then_some(()))
        }
    })
    .await;
    until_lock_wait(&url, "%", "the owner never waited to record the delivery").await;
    kill_replica(&mut first).await;
    holder.release().await;

    taken_over(&store, &held, MINUTE).await;
    // The new owner records what the runner says reached stdin.
    until_delivered(&store, &root, 1).await;
    // Stdin is written in order: a repeat of the first message would be
    // echoed before this one.
    let out = send_until_echoed(
        &mut via_second,
        &store,
        &root,
        "the-next",
        "the next message never came back",
    )
    .await;
    assert_eq!(out.matches("the-plan").count(), 1, "{out}");
    assert_eq!(out.matches("the-next").count(), 1, "{out}");
    end_and_stop(&mut via_second, &root, second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_written_before_its_owner_died_is_not_written_again() {
    let url = troupe_tests::postgres::fresh_database().await;
    let runner = TestRunner::driven().await;
    let endpoint = format!("http://{}", runner.addr);
    let store = PgStore::open(&url).await.unwrap();
    let mut first = replica(&url, &endpoint);
    balanced(&store, 1).await;
    let second = replica(&url, &endpoint);
    balanced(&store, 2).await;
    // A workspace of the low shards, which the first replica keeps.
    let workspace = "stdin-write-2";
    let held = shard_lease(&store, workspace).await;
    assert_eq!(held.holder.pid(), Some(first.pid()), "the first keeps it");
    let mut via_first = first.operator().await;
    let mut via_second = second.operator().await;
    let root = direct_root(&mut via_first, workspace, "echo", "the-plan")
        .await
        .session_id;
    // Running, its first message delivered and echoed: the next is
    // written to it at once.
    until("the first message never came back", MINUTE, || async {
        let process = store.process(&root.as_str().into()).await.unwrap()?;
        (process.delivered_seq == 1 && output(&store, &root).await.contains("the-plan"))
            .then_some(())
    })
    .await;
    until_running(&via_second, &root).await;

    // `mark_delivered` updates the session's process row first: held, the
    // owner's record of the next delivery waits after the runner has it.
    let holder = Holder::rows(
        &url,
        "SELECT 1 FROM processes WHERE session_id = $1 FOR UPDATE",
        &root,
    )
    .await;
    // Sent through the owner, which writes it to the agent before it
    // answers; its record of that cannot commit while the row is held.
    let sent = via_first
        .send_message(troupe_tests::message(&root, "the-second"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(sent.delivery(), DeliveryStatus::Delivered);
    kill_replica(&mut first).await;
    holder.release().await;

    taken_over(&store, &held, MINUTE).await;
    until_delivered(&store, &root, 2).await;
    let out = send_until_echoed(
        &mut via_second,
        &store,
        &root,
        "the-third",
        "the third message never came back",
    )
    .await;
    assert_eq!(out.matches("the-plan").count(), 1, "{out}");
    assert_eq!(out.matches("the-second").count(), 1, "{out}");
    end_and_stop(&mut via_second, &root, second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_finds_its_exec_started_with_fewer_messages_loses_none() {
    let url = troupe_tests::postgres::fresh_database().await;
    let runner = TestRunner::driven().await;
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
            list_execs(&mut client)
                .await
                .iter()
                .any(|e| e.exec_id == "orphan" && e.state() == ExecState::Exited)
                .then_some(())
        }
    })
    .await;

    // The placement writes `workspace_runner`: held, the owner's launch
    // waits before it reads the session's inbox.
    let holder = Holder::table(&url, "LOCK TABLE workspace_runner IN SHARE MODE").await;
    let mut client = owner.operator().await;
    let root = direct_root(&mut client, workspace, "echo", "the-plan")
        .await
        .session_id;
    until_lock_wait(
        &url,
        "%INTO workspace_runner%",
        "the launch never waited on its placement",
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
    holder.release().await;

    until_running(&client, &root).await;
    // Stdin is written in order: the second message, if written, is
    // echoed before this one.
    let out = send_until_echoed(
        &mut client,
        &store,
        &root,
        "the-third",
        "the third message never came back",
    )
    .await;
    assert_eq!(out.matches("earlier-start").count(), 1, "{out}");
    assert_eq!(out.matches("the-plan").count(), 0, "{out}");
    assert_eq!(out.matches("the-second").count(), 1, "{out}");
    end_and_stop(&mut client, &root, owner).await;
}
