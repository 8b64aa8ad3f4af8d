//! What callers send an exec: its stdin, written as frames the supervisor
//! reads (each sequenced frame of a caller's once), and termination.
//!
//! The last sequence written is recorded under the exec's stdin lock once
//! its bytes are in the FIFO, in memory and in `<exec_id>.stdin`, so that
//! a repeated frame (another owner of the session, a restarted runner) is
//! skipped. A runner that stops between the write and the record writes
//! those frames again: at least once there, exactly once otherwise.
//!
//! Stdin is written only once the supervisor holds the FIFO (after its
//! first record): a FIFO's buffer goes with its last descriptor, so bytes
//! written earlier would be lost when the runner closed its end or
//! restarted. Each frame is one `write` of at most `PIPE_BUF` bytes, taken
//! whole or not at all; control lines are written without waiting
//! (`try_write`), since the agent can fill the FIFO.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use anyhow::Context;
use tokio::{io::AsyncWriteExt, net::unix::pipe};

use super::{
    Exec, ExecError, LIVENESS_EVERY, Runner, StdinInput,
    files::{stdin_record, write_stdin_record},
};
use crate::{layout, log::Reason};

impl Runner {
    /// Writes `input` (and maybe the end of input) to the exec's stdin once
    /// its supervisor holds the FIFO; returns once the bytes are in it, with
    /// the last frame sequence the exec's stdin has received.
    pub async fn write_stdin(
        &self,
        exec: &Arc<Exec>,
        input: StdinInput,
        close: bool,
    ) -> Result<u64, ExecError> {
        self.queue_stdin(exec, input, close).await.await
    }

    /// Takes the exec's stdin (so writes keep their order), then returns the
    /// write to await. The write runs in a task of its own, so a caller that
    /// goes away cannot leave half a frame.
    pub(super) async fn queue_stdin(
        &self,
        exec: &Arc<Exec>,
        input: StdinInput,
        close: bool,
    ) -> impl Future<Output = Result<u64, ExecError>> + use<> {
        let id = exec.meta.exec_id.clone();
        let record = stdin_record(&self.settings, &id);
        let exec = exec.clone();
        let exited = exec.progress().exit.is_some();
        let stdin = exec.stdin.clone().lock_owned().await;
        let mut progress = exec.subscribe();
        let task = tokio::spawn(async move {
            let mut stdin = stdin;
            if exited {
                return Err(ExecError::Conflict(format!("exec {id:?} has exited")));
            }
            let Some(pipe) = stdin.as_mut() else {
                return Err(ExecError::Conflict(format!(
                    "stdin of exec {id:?} is closed"
                )));
            };
            // Under the lock: what another write recorded is seen here.
            let (data, last) = match input {
                StdinInput::Bytes(data) => (data, None),
                StdinInput::Frames(frames) => {
                    let received = exec.stdin_sequence.load(Ordering::SeqCst);
                    let fresh: Vec<_> = frames
                        .into_iter()
                        .filter(|f| f.sequence > received)
                        .collect();
                    let last = fresh.last().map(|f| f.sequence);
                    (fresh.into_iter().flat_map(|f| f.data).collect(), last)
                }
            };
            let gone =
                || ExecError::Conflict(format!("exec {id:?} exited before reading its stdin"));
            // The supervisor opens the FIFO before it writes its first
            // record. Bytes written before then die with the runner's
            // descriptor (a FIFO's buffer goes with its last one: a close,
            // a restart), so they wait for that record.
            let supervised = progress
                .wait_for(|p| p.last_sequence > 0 || p.exit.is_some())
                .await
                .map(|p| p.exit.is_none());
            if !supervised.unwrap_or(false) {
                return Err(gone());
            }
            tokio::select! {
                written = write_frames(pipe, &data, close) => {
                    written.context("cannot write to the exec's stdin")?;
                }
                _ = progress.wait_for(|p| p.exit.is_some()) => return Err(gone()),
            }
            if let Some(last) = last {
                if let Err(e) = write_stdin_record(&record, last) {
                    tracing::warn!(exec = %id, error = %e, "cannot record the stdin sequence");
                }
                exec.stdin_sequence.store(last, Ordering::SeqCst);
            }
            if close {
                *stdin = None;
            }
            Ok(exec.stdin_sequence())
        });
        async move { task.await.map_err(anyhow::Error::from)? }
    }

    /// Stops the exec and every process it started; returns once it has exited.
    pub async fn terminate(&self, exec: &Arc<Exec>, grace: Duration) -> Result<(), ExecError> {
        let mut progress = exec.subscribe();
        if progress.borrow().exit.is_some() {
            return Ok(());
        }
        exec.ask_to_end(Reason::Killed, grace);
        let wait = grace + Duration::from_secs(3);
        if tokio::time::timeout(wait, progress.wait_for(|p| p.exit.is_some()))
            .await
            .is_ok()
        {
            return Ok(());
        }
        // The supervisor is gone, stopped or stuck: kill the uid from outside.
        tracing::warn!(exec = %exec.meta.exec_id, "supervisor did not stop the exec; killing its uid");
        self.engine
            .kill_uid(&exec.meta.container_id, exec.meta.uid)
            .await?;
        let wait = LIVENESS_EVERY * 3;
        match tokio::time::timeout(wait, progress.wait_for(|p| p.exit.is_some())).await {
            Ok(_) => Ok(()),
            Err(_) => Err(anyhow::anyhow!("the exec did not end").into()),
        }
    }
}
/// Writes `data` as stdin frames, each in one `write` of at most
/// `PIPE_BUF` bytes, which a pipe takes whole or not at all: a runner that
/// stops between two writes never leaves half a frame in the FIFO.
async fn write_frames(pipe: &mut pipe::Sender, data: &[u8], close: bool) -> std::io::Result<()> {
    let mut frames: Vec<Vec<u8>> = data
        .chunks(layout::STDIN_FRAME)
        .map(|chunk| {
            let mut frame = Vec::with_capacity(chunk.len() + 4);
            frame.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
            frame.extend_from_slice(chunk);
            frame
        })
        .collect();
    if close {
        frames.push(layout::STDIN_CLOSE.to_le_bytes().to_vec());
    }
    for frame in frames {
        let written = pipe.write(&frame).await?;
        if written != frame.len() {
            return Err(std::io::Error::other("a stdin frame was split"));
        }
    }
    Ok(())
}
