//! Outages of what the runner depends on: its Docker engine stopping and
//! coming back, down when the runner starts, or hanging (taking connections
//! and answering nothing), and starts that cannot be made before their
//! deadline.

use crate::common;

use std::time::Duration;

use common::{
    TestRunner, collect,
    pair::{MINUTE, Pair},
    private_engine::PrivateEngine,
    run_sh, start_request, watch,
};
use tokio_stream::StreamExt;
use tonic::{Code, Streaming};
use tonic_health::pb::{
    HealthCheckRequest, HealthCheckResponse, health_check_response::ServingStatus,
    health_client::HealthClient,
};
use troupe_proto::runner::{ExitReason, exec_event};
use troupe_proto::{
    runner::runner_service_server::SERVICE_NAME,
    session::{SessionStatus, session_event},
};

mod engine_down;
mod hangs;
mod sessions;

/// How soon an outage must show: in health, and in the sessions it ended.
const SOON: Duration = Duration::from_secs(10);

/// An agent that prints a numbered line every 0.3 s, forever.
const TICKER: &str = "i=0; while :; do echo tick $i; i=$((i+1)); sleep 0.3; done";

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
    let mut health = runner.health().await;
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
        let stream = watch(&mut runner.client().await, exec_id, 0).await;
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
    let mut events = pair.watch(id).await;
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
