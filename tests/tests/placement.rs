//! Runners in the store, on SQLite and PostgreSQL alike: registrations and
//! their leases, placement by room, a workspace staying on its runner, a
//! lapsed runner's sessions found lost and its workspaces placed again once
//! idle, and concurrent placements of one workspace agreeing.

use std::time::{Duration, Instant};

use troupe_session_svc::{
    error::{QuotaLeft, SessionError},
    model::{
        Action, AuditRecord, EndReason, ExitReason, Failure, NewSession, RunnerName, RunnerSpec,
        Trust,
    },
    placement::Place,
    store::{Fence, prelude::*},
};
use troupe_tests::stores::{self, postgres, sqlite};

const LONG: Duration = Duration::from_secs(3600);

fn spec(name: &str, capacity: u32) -> RunnerSpec {
    RunnerSpec {
        name: RunnerName::parse(name).expect("name"),
        endpoint: format!("http://{name}.invalid:7401"),
        capacity,
    }
}

fn on(name: &str) -> Place {
    Place::On(RunnerName::parse(name).expect("name"))
}

/// A root session `id` in `workspace`.
async fn root<S: Store>(store: &S, id: &str, workspace: &str) {
    let new = NewSession {
        workspace_id: workspace.into(),
        ..stores::new_session(id, Trust::Direct)
    };
    store
        .create_root(new, None, audit(id), &|_| Ok(QuotaLeft::default()))
        .await
        .expect("root");
}

fn audit(target: &str) -> AuditRecord {
    stores::operator_audit(Action::SendMessage, target)
}

async fn fence<S: Store>(store: &S) -> Fence {
    stores::lease_fence(store).await
}

/// New workspaces go to the live runner with the most room (ties by name);
/// a workspace stays on its runner whatever the room elsewhere; a session
/// placed once keeps its runner.
async fn placed_by_room_and_workspaces_stay<S: Store>(store: &S) {
    let fence = fence(store).await;
    for (id, ws) in [
        ("a", "w1"),
        ("b", "w2"),
        ("c", "w3"),
        ("d", "w1"),
        ("e", "w4"),
    ] {
        root(store, id, ws).await;
    }
    assert_eq!(
        store.start_process(&fence, &"a".into()).await.unwrap(),
        Place::Wait,
        "no runner yet"
    );
    store.register_runner(&spec("r1", 2), LONG).await.unwrap();
    store.register_runner(&spec("r2", 3), LONG).await.unwrap();
    assert_eq!(
        store.start_process(&fence, &"a".into()).await.unwrap(),
        on("r2")
    );
    // r1 and r2 both have room 2: the first name.
    assert_eq!(
        store.start_process(&fence, &"b".into()).await.unwrap(),
        on("r1")
    );
    assert_eq!(
        store.start_process(&fence, &"c".into()).await.unwrap(),
        on("r2")
    );
    // r3 has the most room, but w1 lives on r2.
    store.register_runner(&spec("r3", 10), LONG).await.unwrap();
    assert_eq!(
        store.start_process(&fence, &"d".into()).await.unwrap(),
        on("r2")
    );
    assert_eq!(
        store.start_process(&fence, &"e".into()).await.unwrap(),
        on("r3")
    );
    assert_eq!(
        store.start_process(&fence, &"a".into()).await.unwrap(),
        on("r2")
    );
    let runners = store.runners().await.unwrap();
    let load: Vec<(&str, u32, bool)> = runners
        .iter()
        .map(|r| (r.name.as_str(), r.active, r.live))
        .collect();
    assert_eq!(
        load,
        [("r1", 1, true), ("r2", 3, true), ("r3", 1, true)],
        "{runners:?}"
    );
    let process = store.process(&"d".into()).await.unwrap().expect("process");
    assert_eq!(process.runner, Some(RunnerName::parse("r2").unwrap()));
}

/// A runner whose lease lapses: its active sessions are the driver's to
/// fail (`runner_lost`); a new session of its workspace waits while they
/// are active, then goes elsewhere; registering again bumps the generation
/// (a renewal does not).
async fn a_lapsed_runner_is_lost_and_its_workspace_moves_once_idle<S: Store>(store: &S) {
    let fence = fence(store).await;
    let short = Duration::from_millis(600);
    let first = store.register_runner(&spec("r1", 10), short).await.unwrap();
    store.register_runner(&spec("r2", 1), LONG).await.unwrap();
    root(store, "a", "w1").await;
    root(store, "b", "w1").await;
    assert_eq!(
        store.start_process(&fence, &"a".into()).await.unwrap(),
        on("r1")
    );
    assert_eq!(
        store.register_runner(&spec("r1", 10), short).await.unwrap(),
        first,
        "a renewal keeps the generation"
    );
    assert!(stores::work(store).await.runner_lost.is_empty());
    let deadline = Instant::now() + Duration::from_secs(5);
    while stores::work(store).await.runner_lost.is_empty() {
        assert!(Instant::now() < deadline, "r1's lease never lapsed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(stores::work(store).await.runner_lost, ["a"]);
    let r1 = store.runners().await.unwrap();
    assert!(!r1[0].live, "{r1:?}");
    // w1 still has a on r1: b waits.
    assert_eq!(
        store.start_process(&fence, &"b".into()).await.unwrap(),
        Place::Wait
    );
    assert!(store.process(&"b".into()).await.unwrap().is_none());
    assert!(
        store
            .fail_session(&fence, &"a".into(), Failure::RunnerLost, "lost", audit("a"))
            .await
            .unwrap()
    );
    let a = store.get_session(&"a".into()).await.unwrap().unwrap();
    assert_eq!(a.end_reason, Some(EndReason::Exit(ExitReason::RunnerLost)));
    assert!(stores::work(store).await.runner_lost.is_empty());
    assert_eq!(
        store.start_process(&fence, &"b".into()).await.unwrap(),
        on("r2")
    );
    let again = store.register_runner(&spec("r1", 10), short).await.unwrap();
    assert_eq!(again, first + 1, "a return is a new generation");
}

/// The embedded runner's name is not for registration, and the embedded
/// runner needs no lease.
async fn the_embedded_runner_is_its_own<S: Store>(store: &S) {
    let fence = fence(store).await;
    troupe_tests::embedded_runner(store, &fence).await;
    let taken = store
        .register_runner(
            &RunnerSpec {
                name: RunnerName::embedded(),
                endpoint: "http://elsewhere:1".to_owned(),
                capacity: 1,
            },
            LONG,
        )
        .await;
    assert!(
        matches!(
            taken,
            Err(SessionError::InvalidArgument { field: "name", .. })
        ),
        "{taken:?}"
    );
    let runners = store.runners().await.unwrap();
    assert_eq!(runners.len(), 1);
    assert!(runners[0].is_static && runners[0].live);
    assert_eq!(runners[0].endpoint, "http://127.0.0.1:9");
    store.set_static_runner(&fence, None).await.unwrap();
    assert!(store.runners().await.unwrap().is_empty());
}

/// Placements of one new workspace made at once agree on one runner (five
/// workspaces, ten sessions each, all at once).
async fn concurrent_placements_of_a_workspace_agree<S: Store>(store: &S) {
    let fence = fence(store).await;
    for name in ["r1", "r2", "r3", "r4"] {
        store.register_runner(&spec(name, 100), LONG).await.unwrap();
    }
    let mut ids = Vec::new();
    for w in 0..5 {
        for i in 0..10 {
            let id = format!("w{w}s{i}");
            root(store, &id, &format!("w{w}")).await;
            ids.push((w, id));
        }
    }
    let placed = futures::future::join_all(ids.iter().map(|(w, id)| {
        let fence = fence.clone();
        async move { (*w, store.start_process(&fence, &id.into()).await.unwrap()) }
    }))
    .await;
    for w in 0..5 {
        let of: Vec<&Place> = placed
            .iter()
            .filter(|(pw, _)| *pw == w)
            .map(|(_, p)| p)
            .collect();
        assert!(matches!(of[0], Place::On(_)), "{of:?}");
        assert!(of.iter().all(|p| *p == of[0]), "workspace w{w}: {of:?}");
    }
}

#[tokio::test]
async fn sqlite_placed_by_room_and_workspaces_stay() {
    let (_dir, store) = sqlite().await;
    placed_by_room_and_workspaces_stay(&store).await;
}

#[tokio::test]
async fn postgres_placed_by_room_and_workspaces_stay() {
    placed_by_room_and_workspaces_stay(&postgres().await).await;
}

#[tokio::test]
async fn sqlite_a_lapsed_runner_is_lost_and_its_workspace_moves_once_idle() {
    let (_dir, store) = sqlite().await;
    a_lapsed_runner_is_lost_and_its_workspace_moves_once_idle(&store).await;
}

#[tokio::test]
async fn postgres_a_lapsed_runner_is_lost_and_its_workspace_moves_once_idle() {
    a_lapsed_runner_is_lost_and_its_workspace_moves_once_idle(&postgres().await).await;
}

#[tokio::test]
async fn sqlite_the_embedded_runner_is_its_own() {
    let (_dir, store) = sqlite().await;
    the_embedded_runner_is_its_own(&store).await;
}

#[tokio::test]
async fn postgres_the_embedded_runner_is_its_own() {
    the_embedded_runner_is_its_own(&postgres().await).await;
}

#[tokio::test]
async fn sqlite_concurrent_placements_of_a_workspace_agree() {
    let (_dir, store) = sqlite().await;
    concurrent_placements_of_a_workspace_agree(&store).await;
}

#[tokio::test]
async fn postgres_concurrent_placements_of_a_workspace_agree() {
    concurrent_placements_of_a_workspace_agree(&postgres().await).await;
}
