//! Several `troupe-session` processes with `--runner` on one PostgreSQL
//! database, as the takeover tests start them, and what those tests read
//! back: a session's output from the database, its status.

use std::{path::Path, path::PathBuf, time::Duration};

use base64::Engine as _;
use troupe_proto::session::SessionStatus;
use troupe_session_svc::{
    model::{EventFilter, EventKind},
    store::{EventPage, LogStore, PgStore},
};
use troupe_tests::process::SessionProcess;

/// Lines the root agent prints, one every 20 ms, before it echoes its stdin.
pub const LINES: usize = 250;

/// The replicas' `--lease-ttl-ms`.
pub const LEASE_TTL: Duration = Duration::from_millis(1000);

pub fn binary() -> String {
    let exe = std::env::current_exe().unwrap();
    let path: PathBuf = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("troupe-session");
    assert!(
        path.exists(),
        "build the service first: cargo build -p troupe-session-svc ({})",
        path.display()
    );
    path.display().to_string()
}

/// A replica on `url` driving `runner`, with agents `printer`, `brief` and
/// `echo` (`cat`: each stdin line back as it comes).
pub fn replica(url: &str, runner: &str) -> SessionProcess {
    replica_logging(url, runner, None)
}

/// [`replica`], its log written to `log` if given.
pub fn replica_logging(url: &str, runner: &str, log: Option<&Path>) -> SessionProcess {
    let dir = tempfile::tempdir().unwrap();
    let agents = dir.path().join("data/agents");
    std::fs::create_dir_all(&agents).unwrap();
    let printer =
        format!("i=0; while [ $i -lt {LINES} ]; do i=$((i+1)); echo line$i; sleep 0.02; done; cat");
    for (name, script) in [
        ("printer", printer.as_str()),
        ("brief", "sleep 3; echo done"),
        ("echo", "cat"),
    ] {
        let command = serde_json::to_string(&["sh", "-c", script]).unwrap();
        std::fs::write(
            agents.join(format!("{name}.md")),
            format!("---\nname: {name}\ndescription: test agent\ncommand: {command}\n---\n"),
        )
        .unwrap();
    }
    let ttl = LEASE_TTL.as_millis().to_string();
    SessionProcess::start_logging(
        &binary(),
        dir,
        &[
            "--database-url",
            url,
            "--runner",
            runner,
            "--lease-ttl-ms",
            &ttl,
            "--lease-renew-ms",
            "200",
        ],
        &[],
        log,
    )
}

pub async fn until<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    limit: Duration,
    mut probe: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every output byte of a session's output events, in order.
pub async fn output(store: &PgStore, id: &str) -> String {
    let filter = EventFilter {
        session_id: Some(id.into()),
        ..EventFilter::default()
    };
    let mut cursor = 0;
    let mut out = Vec::new();
    loop {
        let EventPage::Events(events) = store.events_after(&filter, cursor, 500).await.unwrap()
        else {
            panic!("pruned");
        };
        if events.is_empty() {
            return String::from_utf8_lossy(&out).into_owned();
        }
        for e in events {
            cursor = e.id;
            if e.kind == EventKind::Output {
                let detail: serde_json::Value = serde_json::from_str(&e.detail).unwrap();
                out.extend(
                    base64::engine::general_purpose::STANDARD
                        .decode(detail["data"].as_str().unwrap())
                        .unwrap(),
                );
            }
        }
    }
}

pub async fn status(client: &mut troupe_tests::Client, id: &str) -> SessionStatus {
    client
        .get_session(troupe_tests::get(id))
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap()
        .status()
}
