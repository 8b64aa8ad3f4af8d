//! Several real `troupe-session` processes on one PostgreSQL database, each
//! with `--runner`, driving one real runner (PostgreSQL only: run under
//! `scripts/pg-env`; the binary comes from `cargo build -p
//! troupe-session-svc`). One owns the background work at a time; when it is
//! killed (SIGKILL) another takes over within a few seconds and nothing is
//! lost or repeated (an owner paused past its lease: `paused_owner.rs`).

mod common;

use std::time::Duration;

use common::{
    MINUTE, TestRunner,
    replicas::{LINES, output, replica, status, until},
};
use troupe_proto::session::{
    CreateRootSessionRequest, CreateSessionRequest, ExecutionMode, SessionStatus, TrustLevel,
};
use troupe_session_svc::store::{PgStore, Store};
use troupe_tests::OPERATOR_TOKEN;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owner_is_taken_over_and_nothing_is_lost_or_repeated() {
    let url = troupe_tests::postgres::fresh_database().await;
    let runner = TestRunner::start_with(|c| c.operator_token = Some(OPERATOR_TOKEN.into())).await;
    let endpoint = format!("http://{}", runner.addr);
    let store = PgStore::open(&url).await.unwrap();
    let first = replica(&url, &endpoint);
    let held = until("nobody took the lease", MINUTE, || async {
        store.lease().await.unwrap().filter(|l| l.live)
    })
    .await;
    let second = replica(&url, &endpoint);
    let mut via_second = second.operator().await;
    // Created through the replica that does not own: the owner starts it.
    let root = via_second
        .create_root_session(CreateRootSessionRequest {
            workspace_id: "takeover".into(),
            trust_level: TrustLevel::Direct as i32,
            title: "root".into(),
            agent_name: "printer".into(),
            initial_message: "first".into(),
            request_id: String::new(),
            budget: None,
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap()
        .session_id;
    // A CALLBACK child whose end falls after the kill.
    let child = via_second
        .create_session(CreateSessionRequest {
            title: "brief".into(),
            agent_name: "brief".into(),
            initial_message: "go".into(),
            parent_session_id: root.clone(),
            mode: ExecutionMode::Callback as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap()
        .session_id;
    until("the root never printed", MINUTE, || async {
        output(&store, &root)
            .await
            .contains("line20\n")
            .then_some(())
    })
    .await;
    // Killed mid-output; a message sent in the gap.
    first.kill();
    let killed_at = tokio::time::Instant::now();
    via_second
        .send_message(troupe_tests::message(&root, "in the gap"))
        .await
        .unwrap();
    let taken = until("nobody took over", Duration::from_secs(10), || async {
        store
            .lease()
            .await
            .unwrap()
            .filter(|l| l.live && l.epoch > held.epoch)
    })
    .await;
    assert!(
        killed_at.elapsed() < Duration::from_secs(5),
        "took over late"
    );
    assert_ne!(taken.holder, held.holder);
    let out = until("the root's output never completed", MINUTE, || async {
        let out = output(&store, &root).await;
        (out.contains(&format!("line{LINES}\n"))
            && out.contains("in the gap")
            && out.contains("session_ended"))
        .then_some(out)
    })
    .await;
    for n in 1..=LINES {
        let line = format!("line{n}");
        assert_eq!(
            out.lines().filter(|l| *l == line).count(),
            1,
            "{line} once in {out}"
        );
    }
    assert_eq!(out.matches("in the gap").count(), 1, "{out}");
    assert_eq!(out.matches("\"first\"").count(), 1, "{out}");
    // The child's notice, once, however its end fell.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let out = output(&store, &root).await;
    assert_eq!(
        out.matches(&child).count(),
        1,
        "one notice of {child}: {out}"
    );
    assert_eq!(
        status(&mut via_second, &child).await,
        SessionStatus::Completed
    );
    via_second
        .terminate_session(troupe_tests::terminate(&root))
        .await
        .unwrap();
    assert!(second.stop().await);
}
