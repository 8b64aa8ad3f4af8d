//! Outages of what the runner depends on: its Docker engine stopping and
//! coming back, down when the runner starts, or hanging (taking connections
//! and answering nothing), and starts that cannot be made before their
//! deadline.

mod common;

use std::time::Duration;

use common::{
    TestRunner, collect,
    pair::{MINUTE, Pair},
    private_engine::PrivateEngine,
    run_sh, start_request,
};
use tokio_stream::StreamExt;
use tonic::{Code, Streaming};
use tonic_health::pb::{
    HealthCheckRequest, HealthCheckResponse, health_check_response::ServingStatus,
    health_client::HealthClient,
};
use troupe_proto::runner::{ExitReason, WatchExecRequest, exec_event};
use troupe_proto::{
    runner::runner_service_server::SERVICE_NAME,
    session::{SessionStatus, WatchSessionsRequest, session_event},
};

/// How soon an outage must show: in health, and in the sessions it ended.
const SOON: Duration = Duration::from_secs(10);

/// The engine stops under a running session: the runner says NOT_SERVING,
/// the session ends lost with a reason, a session created meanwhile waits
/// (its start refused as UNAVAILABLE, at no cost of uid or directory); the
/// engine comes back: SERVING again, and the waiting session runs.
#[tokio::test]
async fn a_docker_outage_is_reported_ends_its_sessions_and_is_survived() {
    let mut engine = PrivateEngine::start().await;
    let host = engine.host();
    let pair = Pair::start_on(|c| c.docker_host = Some(host), |_| {}).await;
    let ws = pair.runner.workspace("outage");
    pair.agent(&ws, "holder", "sleep 1000");
    pair.agent(&ws, "greeter", "read -r m; echo \"after: $m\"");
    let held = pair.root(&ws, "holder", "hold").await;
    pair.wait_status(&held.session_id, SessionStatus::Running)
        .await;

    let channel = tonic::transport::Channel::from_shared(format!("http://{}", pair.runner.addr))
        .unwrap()
        .connect()
        .await
        .expect("health channel");
    let mut health = HealthClient::new(channel);
    let mut statuses = health
        .watch(HealthCheckRequest {
            service: SERVICE_NAME.into(),
        })
        .await
        .expect("health watch")
        .into_inner();
    watch_until(&mut statuses, ServingStatus::Serving).await;
    let next_uid = std::fs::read_to_string(pair.runner.config.state_dir().join("next_uid"))
        .expect("uid counter");

    engine.stop().await;

    watch_until(&mut statuses, ServingStatus::NotServing).await;
    assert_eq!(check(&mut health).await, ServingStatus::NotServing);
    let lost = wait_status_within(&pair, &held.session_id, SessionStatus::Failed, SOON).await;
    assert_eq!(lost.end_reason, "container_lost", "{lost:?}");
    let (reason, detail) = ended(&pair, &held.session_id).await;
    assert_eq!(reason, "container_lost");
    assert!(detail.contains("Docker engine stopped"), "{detail}");

    // A start while the engine is down waits for it.
    let refused = pair
        .runner
        .client()
        .await
        .start_exec(start_request(&ws, "refused", &["true"]))
        .await
        .expect_err("no engine, no start");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("Docker engine"),
        "{}",
        refused.message()
    );
    let late = pair.root(&ws, "greeter", "hello").await;
    // Longer than the driver's pause between attempts: it has retried.
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < until {
        let session = pair.get(&late.session_id).await.session.unwrap();
        assert_eq!(session.status(), SessionStatus::Pending, "{session:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!pair.runner.exec_dir(&ws, "refused").exists());
    assert!(!pair.runner.exec_dir(&ws, &late.session_id).exists());

    engine.start_again().await;

    watch_until(&mut statuses, ServingStatus::Serving).await;
    assert_eq!(check(&mut health).await, ServingStatus::Serving);
    let done = pair
        .wait_status(&late.session_id, SessionStatus::Completed)
        .await;
    assert!(
        done.result.unwrap().output_tail.contains("after: "),
        "the agent ran, in a container made again, and read its message"
    );
    // Refused starts took no uid: the one started after them took the next.
    let now = std::fs::read_to_string(pair.runner.config.state_dir().join("next_uid")).unwrap();
    assert_eq!(
        now.trim().parse::<u32>().unwrap(),
        next_uid.trim().parse::<u32>().unwrap() + 1
    );
}

/// A session whose agent cannot be started (the runner is down) stays
/// pending until its start deadline, then fails, saying why.
#[tokio::test]
async fn a_start_not_made_within_its_deadline_fails_the_session() {
    let mut pair = Pair::start_with(|c| c.start_deadline_secs = 2).await;
    let ws = pair.runner.workspace("deadline");
    pair.agent(&ws, "holder", "sleep 1000");
    pair.runner.stop().await;
    let root = pair.root(&ws, "holder", "hold").await;
    assert_eq!(
        pair.get(&root.session_id).await.session.unwrap().status(),
        SessionStatus::Pending
    );
    let failed = wait_status_within(&pair, &root.session_id, SessionStatus::Failed, SOON).await;
    assert_eq!(failed.end_reason, "lost", "{failed:?}");
    let (reason, detail) = ended(&pair, &root.session_id).await;
    assert_eq!(reason, "lost");
    assert!(
        detail.contains("not started within 2s") && detail.contains("runner is unavailable"),
        "{detail}"
    );
}

/// An agent that prints a numbered line every 0.3 s, forever.
const TICKER: &str = "i=0; while :; do echo tick $i; i=$((i+1)); sleep 0.3; done";

/// A runner started while its engine is down serves anyway: NOT_SERVING,
/// its starts refused as UNAVAILABLE at no cost; once the engine answers,
/// SERVING, and its starts work.
#[tokio::test]
async fn a_runner_started_while_the_engine_is_down_serves_and_waits_for_it() {
    let mut engine = PrivateEngine::start().await;
    engine.stop().await;
    let host = engine.host();
    let runner = TestRunner::start_with(|c| c.docker_host = Some(host)).await;
    let ws = runner.workspace("down-at-start");
    assert_health(&runner, ServingStatus::NotServing).await;
    refused(&runner, &ws, "early", SOON).await;

    engine.start_again().await;

    wait_health(&runner, ServingStatus::Serving).await;
    let done = run_sh(&runner, &ws, "late", "echo up").await;
    assert_eq!(done.stdout_text(), "up\n");
    assert_eq!(done.exit, Some((0, ExitReason::Exited, String::new())));
}

/// A runner restarted while its engine is down serves the execs it finds
/// in its state directory: their logs are read, and an exec whose process
/// ended with the engine is told so (container lost) without the engine;
/// once the engine answers, starts work again.
#[tokio::test]
async fn a_runner_restarted_while_the_engine_is_down_serves_and_judges_its_execs() {
    let mut engine = PrivateEngine::start().await;
    let host = engine.host();
    let mut runner = TestRunner::start_with(|c| c.docker_host = Some(host)).await;
    let ws = runner.workspace("down-at-restart");
    runner.sh(&ws, "ticker", TICKER).await;
    let mut watch = Watched::open(&runner, "ticker").await;
    watch.until(|text| text.contains("tick 2\n"), SOON).await;
    runner.stop().await;
    // The exec's process ends with its container.
    engine.stop().await;

    runner.start_again().await;

    assert_health(&runner, ServingStatus::NotServing).await;
    refused(&runner, &ws, "refused", SOON).await;
    let out = collect(&mut runner.client().await, "ticker", 0, SOON).await;
    assert!(
        out.stdout_text().starts_with("tick 0\ntick 1\ntick 2\n"),
        "{:?}",
        out.stdout_text()
    );
    let (code, reason, detail) = out.exit.expect("an exit");
    assert_eq!((code, reason), (-1, ExitReason::ContainerLost), "{detail}");
    assert!(detail.contains("Docker engine stopped"), "{detail}");

    engine.start_again().await;

    wait_health(&runner, ServingStatus::Serving).await;
    let done = run_sh(&runner, &ws, "again", "echo up").await;
    assert_eq!(done.stdout_text(), "up\n");
}

/// An engine that takes connections and never answers (a socket nobody
/// serves) keeps the runner neither from starting nor its callers waiting:
/// NOT_SERVING, and starts refused as UNAVAILABLE within seconds.
#[tokio::test]
async fn a_runner_whose_engine_never_answers_starts_and_refuses_starts_quickly() {
    let dir = tempfile::Builder::new()
        .prefix("troupe-mute.")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let socket = dir.path().join("docker.sock");
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
    let mute = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    let host = format!("unix://{}", socket.display());
    let runner = TestRunner::start_with(|c| c.docker_host = Some(host)).await;
    let ws = runner.workspace("mute");
    assert_health(&runner, ServingStatus::NotServing).await;
    refused(&runner, &ws, "first", PROMPT).await;
    refused(&runner, &ws, "second", PROMPT).await;
    mute.abort();
}

/// The engine hangs under a running exec: a start made before the runner
/// knows is refused within the runner's call timeout, health goes
/// NOT_SERVING, later starts are refused at once, the exec's output still
/// reaches its watcher and the exec is not taken for lost; the engine
/// answers again: SERVING, and starts work.
#[tokio::test]
async fn an_engine_that_hangs_is_not_waited_for() {
    let engine = PrivateEngine::start().await;
    let host = engine.host();
    let runner = TestRunner::start_with(|c| c.docker_host = Some(host)).await;
    let ws = runner.workspace("hang");
    runner.sh(&ws, "ticker", TICKER).await;
    let mut watch = Watched::open(&runner, "ticker").await;
    watch.until(|text| text.contains("tick 1\n"), SOON).await;

    engine.hang();

    refused(&runner, &ws, "unaware", Duration::from_secs(15)).await;
    wait_health(&runner, ServingStatus::NotServing).await;
    refused(&runner, &ws, "aware", PROMPT).await;
    let seen = watch.ticks();
    watch.until(|text| ticks(text) >= seen + 10, SOON).await;

    engine.resume();

    wait_health(&runner, ServingStatus::Serving).await;
    let done = run_sh(&runner, &ws, "after", "echo up").await;
    assert_eq!(done.stdout_text(), "up\n");
    let seen = watch.ticks();
    watch.until(|text| ticks(text) >= seen + 3, SOON).await;
    assert!(watch.exit.is_none(), "{:?}", watch.exit);
}

/// Longest a start may take to be refused once the runner knows its engine
/// does not answer: one ping.
const PROMPT: Duration = Duration::from_secs(5);

/// A start refused as UNAVAILABLE within `limit`, at no cost of directory.
async fn refused(runner: &TestRunner, ws: &str, exec_id: &str, limit: Duration) {
    let mut client = runner.client().await;
    let start = client.start_exec(start_request(ws, exec_id, &["true"]));
    let refused = tokio::time::timeout(limit, start)
        .await
        .unwrap_or_else(|_| panic!("start {exec_id} not answered within {limit:?}"))
        .expect_err("no engine, no start");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("Docker engine"),
        "{}",
        refused.message()
    );
    assert!(!runner.exec_dir(ws, exec_id).exists());
}

/// The runner's health as a check sees it, overall and its service's.
async fn health_of(runner: &TestRunner) -> [ServingStatus; 2] {
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", runner.addr))
        .unwrap()
        .connect()
        .await
        .expect("health channel");
    let mut health = HealthClient::new(channel);
    let mut statuses = [ServingStatus::Unknown; 2];
    for (status, service) in statuses.iter_mut().zip(["", SERVICE_NAME]) {
        *status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health check")
            .into_inner()
            .status();
    }
    statuses
}

async fn assert_health(runner: &TestRunner, want: ServingStatus) {
    assert_eq!(health_of(runner).await, [want; 2]);
}

async fn wait_health(runner: &TestRunner, want: ServingStatus) {
    let deadline = tokio::time::Instant::now() + SOON;
    loop {
        let now = health_of(runner).await;
        if now == [want; 2] {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "health never became {want:?} within {SOON:?}: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What a watch of an exec has delivered so far.
struct Watched {
    stream: Streaming<troupe_proto::runner::ExecEvent>,
    text: String,
    exit: Option<exec_event::Event>,
}

impl Watched {
    async fn open(runner: &TestRunner, exec_id: &str) -> Watched {
        let stream = runner
            .client()
            .await
            .watch_exec(WatchExecRequest {
                exec_id: exec_id.into(),
                after_sequence: 0,
            })
            .await
            .expect("watch")
            .into_inner();
        Watched {
            stream,
            text: String::new(),
            exit: None,
        }
    }

    /// Reads until what was delivered satisfies `done`.
    async fn until(&mut self, done: impl Fn(&str) -> bool, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        while !done(&self.text) {
            match tokio::time::timeout_at(deadline, self.stream.next()).await {
                Ok(Some(Ok(event))) => match event.event {
                    Some(exec_event::Event::Output(out)) => {
                        self.text.push_str(&String::from_utf8_lossy(&out.data));
                    }
                    Some(exited @ exec_event::Event::Exited(_)) => self.exit = Some(exited),
                    _ => {}
                },
                Ok(other) => panic!("watch ended: {other:?}; so far {:?}", self.text),
                Err(_) => panic!("not delivered within {limit:?}; so far {:?}", self.text),
            }
        }
    }

    fn ticks(&self) -> usize {
        ticks(&self.text)
    }
}

fn ticks(text: &str) -> usize {
    text.matches("tick ").count()
}

/// Reads health updates until `want`.
async fn watch_until(statuses: &mut Streaming<HealthCheckResponse>, want: ServingStatus) {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + SOON;
    loop {
        match tokio::time::timeout_at(deadline, statuses.next()).await {
            Ok(Some(Ok(update))) if update.status() == want => return,
            Ok(Some(Ok(update))) => seen.push(update.status()),
            Ok(other) => panic!("health watch ended: {other:?}"),
            Err(_) => panic!("health never became {want:?} within {SOON:?}; seen {seen:?}"),
        }
    }
}

async fn check(health: &mut HealthClient<tonic::transport::Channel>) -> ServingStatus {
    health
        .check(HealthCheckRequest {
            service: SERVICE_NAME.into(),
        })
        .await
        .expect("health check")
        .into_inner()
        .status()
}

async fn wait_status_within(
    pair: &Pair,
    id: &str,
    status: SessionStatus,
    limit: Duration,
) -> troupe_proto::session::Session {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let session = pair.get(id).await.session.unwrap();
        if session.status() == status {
            return session;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{id} did not become {status:?} within {limit:?}: {session:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The reason and detail of the session's end, from its events.
async fn ended(pair: &Pair, id: &str) -> (String, String) {
    let mut events = pair
        .server
        .operator()
        .await
        .watch_sessions(WatchSessionsRequest {
            session_id: id.into(),
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    loop {
        let event = tokio::time::timeout(MINUTE, events.next())
            .await
            .expect("an end event")
            .expect("events")
            .expect("event");
        if let Some(session_event::Detail::Ended(end)) = event.detail {
            return (end.reason, end.detail);
        }
    }
}
