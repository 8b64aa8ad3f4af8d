//! What the takeover and rolling benches share: replicas of the release
//! `troupe-session` with a `printer` agent, printers that number their
//! lines, a watcher that follows them from one replica to another by its
//! cursor, and the count of what reached it.

// Each bench uses a part of it.
#![allow(dead_code)]

use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use troupe_proto::session::{
    CreateRootSessionRequest, EventKind, SessionStatus, TrustLevel, WatchSessionsRequest,
    session_event::Detail,
};
use troupe_session_svc::{
    cursor::Cursor,
    shard::Shard,
    store::{Lease, PgStore, prelude::*},
};
use troupe_tests::{OPERATOR_TOKEN, process::SessionProcess};

use super::common::{
    MINUTE,
    replicas::{binary, output, until},
};

/// The message that ends an agent's printing.
pub const STOP: &str = "stop-printing";

/// Each agent: a printer in the background (a line every 50 ms; on
/// SIGTERM it finishes its line, prints `end<N>` and exits), and the shell
/// reading its stdin until the stop message.
const PRINTER: &str = "( stop=0; trap 'stop=1' TERM; i=0; \
    while [ $stop = 0 ]; do i=$((i+1)); echo line$i; sleep 0.05; done; echo end$i ) & \
    printer=$!; \
    while read -r l; do case \"$l\" in *stop-printing*) kill -TERM $printer; wait $printer; exit 0;; esac; done";

/// A `troupe-session` process with default flags but `--runner`, its log
/// in a file.
pub struct Replica {
    pub process: SessionProcess,
    /// Its connections' `application_name`.
    pub name: String,
}

impl Replica {
    pub fn start(url: &str, runner: &str, name: &str, logs: &Path) -> Replica {
        let sep = if url.contains('?') { '&' } else { '?' };
        let url = format!("{url}{sep}application_name={name}");
        let log = logs.join(format!("{name}.log"));
        let dir = tempfile::tempdir().unwrap();
        let agents = dir.path().join("data/agents");
        std::fs::create_dir_all(&agents).unwrap();
        let command = serde_json::to_string(&["sh", "-c", PRINTER]).unwrap();
        std::fs::write(
            agents.join("printer.md"),
            format!(
                "---\nname: printer\ndescription: prints numbered lines\ncommand: {command}\n---\n"
            ),
        )
        .unwrap();
        let process = SessionProcess::start_logging(
            &binary(),
            dir,
            &["--database-url", &url, "--runner", runner],
            &[],
            Some(&log),
        );
        Replica {
            process,
            name: name.to_owned(),
        }
    }

    /// The shards whose live lease it holds.
    pub async fn shards(&self, store: &PgStore) -> Vec<Shard> {
        let pid = self.process.pid();
        store
            .shard_leases()
            .await
            .unwrap()
            .into_iter()
            .filter(|l| l.live && l.holder.pid() == Some(pid))
            .map(|l| l.shard)
            .collect()
    }
}

/// Starts replicas on one database and runner, each named `<prefix>-r<n>`
/// (its connections' `application_name`), their logs in one directory.
pub struct Starter {
    url: String,
    runner: String,
    prefix: &'static str,
    logs: tempfile::TempDir,
    started: usize,
}

impl Starter {
    pub fn new(url: &str, runner: &str, prefix: &'static str) -> Starter {
        Starter {
            url: url.to_owned(),
            runner: runner.to_owned(),
            prefix,
            logs: tempfile::tempdir().unwrap(),
            started: 0,
        }
    }

    /// The next replica.
    pub fn start(&mut self) -> Replica {
        self.started += 1;
        let name = format!("{}-r{}", self.prefix, self.started);
        Replica::start(&self.url, &self.runner, &name, self.logs.path())
    }

    /// `n` replicas, each answering.
    pub async fn start_all(&mut self, n: usize) -> Vec<Replica> {
        let replicas: Vec<Replica> = (0..n).map(|_| self.start()).collect();
        for r in &replicas {
            r.process.channel().await;
        }
        replicas
    }
}

/// The lease of `shard` as it stands.
pub async fn shard_lease(store: &PgStore, shard: Shard) -> Option<Lease> {
    let leases = store.shard_leases().await.unwrap();
    leases.into_iter().find(|l| l.shard == shard)
}

/// Starts a printer in `workspace` through `replica`; returns its id.
pub async fn printer(replica: &Replica, workspace: &str, title: &str) -> String {
    let created = replica
        .process
        .operator()
        .await
        .create_root_session(CreateRootSessionRequest {
            workspace_id: workspace.to_owned(),
            trust_level: TrustLevel::Direct as i32,
            title: title.to_owned(),
            agent_name: "printer".into(),
            initial_message: "go".into(),
            request_id: String::new(),
            budget: None,
            writable_paths: Vec::new(),
        })
        .await
        .expect("create a printer")
        .into_inner();
    created.session.expect("a session").session_id
}

/// What the watcher received: each session's output bytes, and where and
/// when each output event arrived.
#[derive(Default)]
pub struct Seen {
    cursor: String,
    bytes: HashMap<String, Vec<u8>>,
    /// (shard, position in it, arrival) of every output event, in order.
    outputs: Vec<(Shard, i64, Instant)>,
    completed: Vec<String>,
}

impl Seen {
    /// Output events received so far.
    pub fn outputs(&self) -> usize {
        self.outputs.len()
    }

    /// When the first output event of `shard` past `position` arrived.
    pub fn first_output_after(&self, shard: Shard, position: i64) -> Option<Instant> {
        self.outputs
            .iter()
            .find(|(s, p, _)| *s == shard && *p > position)
            .map(|(_, _, at)| *at)
    }

    fn ended(&self, id: &str) -> bool {
        self.completed.iter().any(|c| c == id)
    }
}

/// A `WatchSessions` of one workspace (or of every one: `""`) on one
/// replica, resumed from the last cursor it received when moved to another.
pub struct Watcher {
    pub endpoint: String,
    task: tokio::task::JoinHandle<()>,
    pub seen: Arc<Mutex<Seen>>,
    workspace: String,
}

impl Watcher {
    pub fn start(seen: Arc<Mutex<Seen>>, workspace: &str, endpoint: &str) -> Watcher {
        let task = tokio::spawn(watch(
            seen.clone(),
            workspace.to_owned(),
            endpoint.to_owned(),
        ));
        Watcher {
            endpoint: endpoint.to_owned(),
            task,
            seen,
            workspace: workspace.to_owned(),
        }
    }

    /// The same watch on `endpoint`, from where this one was.
    pub fn move_to(self, endpoint: &str) -> Watcher {
        self.task.abort();
        Watcher::start(self.seen, &self.workspace, endpoint)
    }

    /// Waits until more than `events` output events past what it has arrive.
    pub async fn flowing(&self, events: usize) {
        let after = self.seen.lock().unwrap().outputs();
        until("no output flows", MINUTE, || async {
            (self.seen.lock().unwrap().outputs() > after + events).then_some(())
        })
        .await;
    }
}

/// Watches `workspace` on `endpoint` from the last cursor seen, again after
/// any interruption.
async fn watch(seen: Arc<Mutex<Seen>>, workspace: String, endpoint: String) {
    let channel = troupe_proto::endpoint::connect(&endpoint)
        .await
        .expect("connect the watcher");
    let mut client =
        troupe_proto::session::session_service_client::SessionServiceClient::with_interceptor(
            channel,
            troupe_proto::endpoint::Bearer::new(Some(OPERATOR_TOKEN)).unwrap(),
        );
    loop {
        let after = seen.lock().unwrap().cursor.clone();
        let request = WatchSessionsRequest {
            workspace_id: workspace.clone(),
            after,
            ..Default::default()
        };
        if let Ok(stream) = client.watch_sessions(request).await {
            let mut stream = stream.into_inner();
            while let Some(Ok(event)) = stream.next().await {
                let at = Instant::now();
                let cursor: Cursor = event.cursor.parse().expect("a cursor");
                let shard = Shard::of(&event.workspace_id);
                let mut seen = seen.lock().unwrap();
                seen.cursor = event.cursor.clone();
                match (event.kind(), &event.detail) {
                    (EventKind::Output, Some(Detail::Output(out))) => {
                        seen.outputs.push((shard, cursor.after(shard), at));
                        seen.bytes
                            .entry(event.session_id.clone())
                            .or_default()
                            .extend_from_slice(&out.data);
                    }
                    (EventKind::Completed, _) => seen.completed.push(event.session_id.clone()),
                    _ => {}
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Tells every printer to stop, waits until each completed and its end
/// reached the watcher, then counts their lines at the watcher and in the
/// database; prints both.
pub async fn stop_and_count(
    replica: &Replica,
    store: &PgStore,
    watcher: Watcher,
    sessions: &[String],
) {
    let mut operator = replica.process.operator().await;
    for id in sessions {
        operator
            .send_message(troupe_tests::message(id, STOP))
            .await
            .expect("send the stop message");
    }
    let seen = watcher.seen.clone();
    for id in sessions {
        until("a printer did not complete", MINUTE, || async {
            let status = troupe_tests::get(id);
            let session = operator.clone().get_session(status).await.ok()?;
            (session.into_inner().session?.status() == SessionStatus::Completed).then_some(())
        })
        .await;
        until(
            "the watcher did not see a printer's end",
            MINUTE,
            || async { seen.lock().unwrap().ended(id).then_some(()) },
        )
        .await;
    }
    let mut watched = Count::default();
    let mut stored = Count::default();
    for id in sessions {
        let text = String::from_utf8_lossy(&seen.lock().unwrap().bytes[id]).into_owned();
        watched.add(&lines(&text));
        stored.add(&lines(&output(store, id).await));
    }
    watcher.task.abort();
    println!();
    println!("| output | lines | lost | repeated |");
    println!("|---|---|---|---|");
    for (name, count) in [("at the watcher", &watched), ("in the database", &stored)] {
        println!(
            "| {name} | {} | {} | {} |",
            count.lines, count.lost, count.repeated
        );
    }
}

/// One session's numbered lines: how many times each number appears, and
/// the last one, from its `end<N>`.
fn lines(text: &str) -> (HashMap<u64, u64>, Option<u64>) {
    let mut counts = HashMap::new();
    let mut last = None;
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("line").and_then(|n| n.parse().ok()) {
            *counts.entry(n).or_insert(0) += 1;
        } else if let Some(n) = line.strip_prefix("end").and_then(|n| n.parse().ok()) {
            last = Some(n);
        }
    }
    (counts, last)
}

/// Lines printed, lost (a number from 1 to the last one that never came,
/// or the `end` line itself missing) and repeated (every copy beyond the
/// first, of any line).
#[derive(Default)]
struct Count {
    lines: u64,
    lost: u64,
    repeated: u64,
}

impl Count {
    fn add(&mut self, (counts, last): &(HashMap<u64, u64>, Option<u64>)) {
        let last = last.unwrap_or_else(|| {
            self.lost += 1;
            counts.keys().copied().max().unwrap_or(0)
        });
        self.lines += last;
        self.lost += (1..=last).filter(|n| !counts.contains_key(n)).count() as u64;
        // Numbers past the end are repeats of nothing: they count as repeated.
        self.repeated += counts
            .iter()
            .map(|(n, c)| if *n > last { *c } else { c - 1 })
            .sum::<u64>();
    }
}
