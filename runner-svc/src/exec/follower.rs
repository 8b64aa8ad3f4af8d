//! The follower: one task per exec that reads its log as the supervisor
//! appends it (woken by inotify), names its supervisor's host process,
//! keeps its log within bounds, checks that it still runs and keeps its
//! deadline, and publishes its end. When the supervisor can no longer
//! record an exit, the follower writes it (container lost, or killed),
//! after cutting any partial record, and only once the engine says the
//! supervisor's exec has ended, or, while the engine does not answer, once
//! its host process is gone: one writer of the log at a time. Every process
//! of the exec's uid is killed before its exit is published.

use std::{fs::File, os::unix::fs::FileExt, sync::Arc, time::Duration};

use anyhow::Context;
use futures::StreamExt;

use super::{Exec, LIVENESS_EVERY, Runner, outage, scanner::Scanner};
use crate::{
    docker::ExecProcess,
    log::{self, Exit, Kind, Reason},
};

impl Runner {
    /// Follows an exec's log from where `scanner` stands until its exit
    /// record (at once if `exit` is it), then ends the exec.
    pub(super) async fn follow(
        self: Arc<Self>,
        exec: Arc<Exec>,
        mut scanner: Scanner,
        exit: Option<Exit>,
    ) {
        let exit = match exit {
            Some(exit) => Some(exit),
            None => self.follow_log(&exec, &mut scanner).await,
        };
        if let Some(exit) = exit {
            self.finish(&exec, exit, &scanner).await;
            self.bound_logs(&exec).await;
        }
    }

    async fn follow_log(self: &Arc<Self>, exec: &Arc<Exec>, scanner: &mut Scanner) -> Option<Exit> {
        let mut wakeups = match watch_file(&exec.log) {
            Ok(stream) => Some(stream),
            Err(e) => {
                tracing::warn!(exec = %exec.meta.exec_id, error = %e, "no inotify; polling the log");
                None
            }
        };
        let mut liveness = tokio::time::interval(LIVENESS_EVERY);
        liveness.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The runner's own deadline, should the supervisor not keep its timeout.
        let deadline = (exec.meta.timeout_ms > 0).then(|| {
            let started =
                std::time::UNIX_EPOCH + Duration::from_micros(exec.meta.started_at_micros);
            let overdue = started
                + Duration::from_millis(exec.meta.timeout_ms + self.settings.timeout_grace_ms)
                + LIVENESS_EVERY * 2;
            let left = overdue
                .duration_since(std::time::SystemTime::now())
                .unwrap_or_default();
            tokio::time::Instant::now() + left
        });
        let mut overdue = false;
        let mut corrupt: Option<String> = None;
        loop {
            if corrupt.is_none() {
                match scanner.scan_blocking(exec).await {
                    Ok(Some(exit)) => return Some(exit),
                    Ok(None) => {
                        if scanner.seq > 0 {
                            self.name_host(exec).await;
                        }
                        self.bound_logs(exec).await;
                    }
                    Err(e) => {
                        tracing::warn!(exec = %exec.meta.exec_id, error = %e, "corrupt exec log; terminating the exec");
                        corrupt = Some(e.to_string());
                        exec.ask_to_end(Reason::Killed, Duration::ZERO);
                    }
                }
            }
            let poll = tokio::time::sleep(Duration::from_millis(50));
            let due = async {
                match deadline {
                    Some(at) if !overdue => tokio::time::sleep_until(at).await,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                () = self.shutdown.cancelled() => return None,
                _ = async {
                    match wakeups.as_mut() {
                        Some(s) => { s.next().await; }
                        None => poll.await,
                    }
                } => {}
                () = due => {
                    overdue = true;
                    tracing::warn!(exec = %exec.meta.exec_id, "exec outlived its timeout; killing its uid");
                    exec.ending.lock().expect("poisoned").get_or_insert(Reason::TimedOut);
                    if let Err(e) = self.engine.kill_uid(&exec.meta.container_id, exec.meta.uid).await {
                        tracing::warn!(exec = %exec.meta.exec_id, error = %e, "cannot kill an overdue exec");
                    }
                }
                _ = liveness.tick() => {
                    match self.check_liveness(exec, scanner, corrupt.as_deref()).await {
                        Ok(Some(exit)) => return Some(exit),
                        Ok(None) => {}
                        Err(e) => tracing::warn!(exec = %exec.meta.exec_id, error = %e, "liveness check failed"),
                    }
                }
            }
        }
    }

    /// Publishes the end of an exec. Whatever its log says, every process
    /// of its uid is killed first: an agent cannot outlive its exec by
    /// writing an exit record itself.
    async fn finish(&self, exec: &Arc<Exec>, mut exit: Exit, scanner: &Scanner) {
        if exit.reason != Reason::ContainerLost
            && let Err(e) = self
                .engine
                .kill_uid(&exec.meta.container_id, exec.meta.uid)
                .await
        {
            tracing::warn!(exec = %exec.meta.exec_id, error = %e, "cannot kill what the exec left");
        }
        if let Some(reason) = *exec.ending.lock().expect("poisoned")
            && exit.reason != Reason::ContainerLost
        {
            exit.reason = reason;
        }
        *exec.control.lock().expect("poisoned") = None;
        *exec.exited_at.lock().expect("poisoned") = Some(std::time::Instant::now());
        exec.progress.send_modify(|p| {
            p.last_sequence = scanner.seq;
            p.end = scanner.pos;
            p.exit = Some(exit);
        });
        *exec.stdin.lock().await = None;
    }

    /// Ends the log for the supervisor when it can no longer do it itself.
    async fn check_liveness(
        &self,
        exec: &Arc<Exec>,
        scanner: &mut Scanner,
        corrupt: Option<&str>,
    ) -> anyhow::Result<Option<Exit>> {
        let meta = &exec.meta;
        let process = match self.observe(exec).await? {
            outage::Seen::Running => return Ok(None),
            outage::Seen::Ended(process) => Some(process),
            outage::Seen::DiedWithEngine => None,
        };
        if corrupt.is_none() {
            // The supervisor may have written its exit just now.
            if let Some(exit) = scanner.scan_blocking(exec).await? {
                return Ok(Some(exit));
            }
        }
        let exit = if process.is_none() {
            self.engine.forget_container(&meta.workspace_id).await;
            outage::died_with_engine()
        } else if !self.engine.container_running(&meta.container_id).await? {
            self.engine.forget_container(&meta.workspace_id).await;
            Exit {
                code: -1,
                reason: Reason::ContainerLost,
                detail: "the workspace container stopped or was removed".into(),
            }
        } else {
            // Whatever the agent left running goes with it.
            self.engine.kill_uid(&meta.container_id, meta.uid).await?;
            let code = match process {
                Some(ExecProcess::Ended(Some(code))) => i32::try_from(code).unwrap_or(-1),
                _ => -1,
            };
            Exit {
                code,
                reason: Reason::Killed,
                detail: match corrupt {
                    Some(e) => format!("the agent corrupted its output log ({e})"),
                    None => "the supervisor ended without recording an exit".into(),
                },
            }
        };
        // Only the runner writes now: cut a partial record, then append the exit.
        let record = log::encode(Kind::Exited, &log::exit_payload(&exit));
        exec.log.set_len(scanner.pos)?;
        exec.log.write_all_at(&record, scanner.pos)?;
        scanner
            .scan_blocking(exec)
            .await?
            .context("the appended exit record was not read back")
            .map(Some)
    }
}
/// Wakes whenever the file is written (inotify, which sees writes made
/// from inside the container too).
fn watch_file(file: &File) -> std::io::Result<impl futures::Stream<Item = ()> + Unpin + use<>> {
    use inotify::{Inotify, WatchMask};
    use std::os::fd::AsRawFd;
    let inotify = Inotify::init()?;
    // Through our own descriptor: the path in the agent's directory may change.
    let path = format!("/proc/self/fd/{}", file.as_raw_fd());
    inotify
        .watches()
        .add(&path, WatchMask::MODIFY | WatchMask::ATTRIB)?;
    Ok(inotify.into_event_stream([0u8; 1024])?.map(|_| ()).boxed())
}
