//! What an exec produced, and the ways the runner's tests watch it: to
//! its end, until it prints something, or until one of them exits.

use std::time::Duration;

use tokio_stream::StreamExt;
use tonic::Streaming;
use troupe_proto::runner::{ExecEvent, ExitReason, OutputStream, WatchExecRequest, exec_event};

use super::{Client, MINUTE, TestRunner};

/// Everything an exec produced, from a watch that ran to its end.
#[derive(Debug, Default)]
pub struct Collected {
    pub events: Vec<ExecEvent>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Output chunks in order, each with its stream.
    pub chunks: Vec<(OutputStream, Vec<u8>)>,
    pub exit: Option<(i32, ExitReason, String)>,
}

impl Collected {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    pub fn add(&mut self, event: ExecEvent) {
        match &event.event {
            Some(exec_event::Event::Output(out)) => {
                let stream = out.stream();
                match stream {
                    OutputStream::Stderr => self.stderr.extend_from_slice(&out.data),
                    _ => self.stdout.extend_from_slice(&out.data),
                }
                match self.chunks.last_mut() {
                    Some((s, data)) if *s == stream => data.extend_from_slice(&out.data),
                    _ => self.chunks.push((stream, out.data.clone())),
                }
            }
            Some(exec_event::Event::Exited(exit)) => {
                self.exit = Some((exit.exit_code, exit.reason(), exit.detail.clone()));
            }
            _ => {}
        }
        self.events.push(event);
    }
}

/// The events of `exec_id` after sequence `after`, as a watch streams them.
pub async fn watch(client: &mut Client, exec_id: &str, after: u64) -> Streaming<ExecEvent> {
    client
        .watch_exec(WatchExecRequest {
            exec_id: exec_id.into(),
            after_sequence: after,
        })
        .await
        .expect("watch")
        .into_inner()
}

/// Watches `exec_id` after `after` until its exit event (or `limit`).
pub async fn collect(client: &mut Client, exec_id: &str, after: u64, limit: Duration) -> Collected {
    let mut stream = watch(client, exec_id, after).await;
    let mut out = Collected::default();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(Ok(event))) => out.add(event),
            Ok(Some(Err(status))) => panic!("watch failed: {status:?}"),
            Ok(None) => return out,
            Err(_) => panic!(
                "exec {exec_id} did not end within {limit:?}; so far: stdout {:?} stderr {:?}",
                out.stdout_text(),
                out.stderr_text()
            ),
        }
    }
}

/// Runs `sh -c script` to its end and returns what it produced.
pub async fn run_sh(
    runner: &TestRunner,
    workspace: &str,
    exec_id: &str,
    script: &str,
) -> Collected {
    runner.sh(workspace, exec_id, script).await;
    collect(
        &mut runner.client().await,
        exec_id,
        0,
        Duration::from_secs(60),
    )
    .await
}

/// Watches `exec_id` from its start until it has printed `needle`, within
/// a minute. Only what each event adds is searched, so a flood stays cheap.
pub async fn wait_for_output(client: &mut Client, exec_id: &str, needle: &str) {
    let mut stream = watch(client, exec_id, 0).await;
    let needle = needle.as_bytes();
    let mut seen = Collected::default();
    // Bytes before this were searched already, but for a needle's length
    // less one: the needle may start in them.
    let mut searched: usize = 0;
    loop {
        let from = searched.saturating_sub(needle.len().saturating_sub(1));
        if seen.stdout[from..]
            .windows(needle.len())
            .any(|w| w == needle)
        {
            return;
        }
        searched = seen.stdout.len();
        let event = tokio::time::timeout(MINUTE, stream.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{exec_id} never printed {:?}",
                    String::from_utf8_lossy(needle)
                )
            })
            .expect("the watch goes on")
            .expect("an event");
        seen.add(event);
    }
}

/// The execs of `client`'s runner.
pub async fn list_execs(client: &mut Client) -> Vec<troupe_proto::runner::ExecInfo> {
    client
        .list_execs(troupe_proto::runner::ListExecsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .execs
}

/// The exit of the first exec of `client`'s runner that has one, once one
/// has (execs are polled), within a minute.
pub async fn first_exit(client: &mut Client) -> troupe_proto::runner::Exited {
    tokio::time::timeout(MINUTE, async {
        loop {
            if let Some(exit) = list_execs(client).await.into_iter().find_map(|e| e.exit) {
                return exit;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("an exec ends within a minute")
}
