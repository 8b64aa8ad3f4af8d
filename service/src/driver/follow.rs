//! The follower of a running exec: it watches the runner's events into the
//! ledger, from the last one applied, mapping each to a [`ProcessChange`].
//! Output the watch already holds when one is written goes with it, in one
//! write of about [`OUTPUT_RUN_BYTES`] at most: a flooding agent's output is
//! ingested at the pace of runs, not of chunks.

use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use tonic::{Code, Status};
use troupe_proto::runner::{self as rpb, WatchExecRequest, exec_event};

use super::{Driver, RETRY, Term, system_audit};
use crate::{
    error::SessionError,
    model::{Action, ExitReason, Failure, OutputChunk, ProcessChange, ProcessExit, SessionId},
    store::Store,
};

/// Where the follower stops adding output to a run (one more chunk, of at
/// most 64 KiB, may take it past): what one followed session holds in
/// memory.
const OUTPUT_RUN_BYTES: usize = 1 << 20;

impl<S: Store> Driver<S> {
    /// Follows a session's runner events into the ledger, in the background,
    /// from the last one applied.
    pub(super) fn follow(self: &Arc<Self>, term: &Term, session_id: SessionId) {
        if !self
            .following
            .lock()
            .expect("poisoned")
            .insert(session_id.clone())
        {
            return;
        }
        let driver = self.clone();
        let term = term.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = driver.follow_until_exit(&term, &session_id) => {}
                () = term.cancelled() => {}
            }
            driver
                .following
                .lock()
                .expect("poisoned")
                .remove(&session_id);
        });
    }

    pub(super) async fn follow_until_exit(self: &Arc<Self>, term: &Term, session_id: &SessionId) {
        loop {
            if !term.live() {
                return;
            }
            match self.follow_once(term, session_id).await {
                Ok(true) => return,
                Ok(false) => {}
                Err(status) if status.code() == Code::NotFound => {
                    let detail = "the runner has no process for this session";
                    let audit = system_audit(Action::Reconcile, session_id, true, &detail);
                    self.fail(term, session_id, Failure::Lost, detail, audit)
                        .await;
                    return;
                }
                Err(status) => {
                    tracing::debug!(session = %session_id, %status, "runner watch interrupted");
                    // Ended meanwhile (its runner lost, say): nothing to follow.
                    if !self.is_active(session_id).await {
                        return;
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(RETRY) => {}
                () = term.cancelled() => return,
            }
        }
    }

    /// One watch of the runner's events; true once the exit was applied.
    pub(super) async fn follow_once(
        self: &Arc<Self>,
        term: &Term,
        session_id: &SessionId,
    ) -> Result<bool, Status> {
        let process = self.store.process(session_id).await.map_err(internal)?;
        let after = process.as_ref().map_or(0, |p| p.runner_seq);
        let Some(runner) = process.and_then(|p| p.runner) else {
            return Err(Status::not_found("the session's process was never placed"));
        };
        let Some(client) = self.runner_client(&runner).await else {
            return Err(Status::unavailable(format!(
                "runner {runner} has no usable endpoint"
            )));
        };
        let mut stream = client
            .clone()
            .watch_exec(WatchExecRequest {
                exec_id: session_id.to_string(),
                after_sequence: after,
            })
            .await?
            .into_inner();
        // The runner answers again (after a restart of either side, or a
        // lost connection): what could not be written meanwhile goes now.
        self.deliver_in(term, session_id).await;
        // An event the last run of output stopped at, not yet applied.
        let mut held = None;
        loop {
            let event = match held.take() {
                Some(event) => event,
                None => {
                    let event = tokio::select! {
                        event = stream.next() => event,
                        () = term.cancelled() => return Ok(true),
                    };
                    let Some(event) = event.transpose()? else {
                        return Ok(false);
                    };
                    event
                }
            };
            let Some(change) = change(&event) else {
                continue;
            };
            if let ProcessChange::Output { stream: name, data } = change {
                let first = OutputChunk {
                    runner_seq: event.sequence,
                    stream: name,
                    data,
                };
                let run = output_run(first, &mut stream);
                self.record_outputs(term, session_id, &run.chunks).await?;
                held = run.next;
                match run.end {
                    Some(Err(status)) => return Err(status),
                    Some(Ok(())) => return Ok(false),
                    None => continue,
                }
            }
            let exited = matches!(change, ProcessChange::Exited(_));
            let started = change == ProcessChange::Started;
            let applied = term
                .check(
                    self.store
                        .record_process(
                            term.fence(),
                            session_id,
                            event.sequence,
                            change.clone(),
                            self.tail_max,
                        )
                        .await,
                )
                .map_err(internal)?;
            if started {
                // Messages sent while it was pending.
                self.deliver_in(term, session_id).await;
            }
            if exited {
                // Due since the exit's commit (CALLBACK mode): written now,
                // or by the next owner if this one dies first.
                if applied.is_some() {
                    self.callback(term, session_id).await;
                }
                return Ok(true);
            }
        }
    }

    /// Applies a run of output in one write, and counts what it applied.
    async fn record_outputs(
        &self,
        term: &Term,
        session_id: &SessionId,
        chunks: &[OutputChunk],
    ) -> Result<(), Status> {
        let applied = term
            .check(
                self.store
                    .record_outputs(term.fence(), session_id, chunks, self.tail_max)
                    .await,
            )
            .map_err(internal)?;
        for chunk in &chunks[chunks.len() - applied..] {
            crate::metrics::output(chunk.stream, chunk.data.len());
        }
        Ok(())
    }
}

/// Output events that came together, applied in one write.
struct OutputRun {
    chunks: Vec<OutputChunk>,
    /// The event after them, if it is not output.
    next: Option<rpb::ExecEvent>,
    /// The watch's end right after them: its error, or `Ok` at its close.
    end: Option<Result<(), Status>>,
}

/// Takes `first` and the output events after it that the watch already
/// holds, in rising runner order, until the run holds [`OUTPUT_RUN_BYTES`]:
/// what the runner sent while the last run was written. It never waits for
/// an event. An event out of order ends the run and is applied alone (as
/// one applied before, it is a no-op).
fn output_run(
    first: OutputChunk,
    stream: &mut (impl futures::Stream<Item = Result<rpb::ExecEvent, Status>> + Unpin),
) -> OutputRun {
    let mut bytes = first.data.len();
    let mut run = OutputRun {
        chunks: vec![first],
        next: None,
        end: None,
    };
    while bytes < OUTPUT_RUN_BYTES {
        let event = match stream.next().now_or_never() {
            None => break,
            Some(None) => {
                run.end = Some(Ok(()));
                break;
            }
            Some(Some(Err(status))) => {
                run.end = Some(Err(status));
                break;
            }
            Some(Some(Ok(event))) => event,
        };
        match change(&event) {
            Some(ProcessChange::Output { stream, data })
                if run
                    .chunks
                    .last()
                    .is_some_and(|c| c.runner_seq < event.sequence) =>
            {
                bytes += data.len();
                run.chunks.push(OutputChunk {
                    runner_seq: event.sequence,
                    stream,
                    data,
                });
            }
            Some(_) => {
                run.next = Some(event);
                break;
            }
            None => {}
        }
    }
    run
}

/// What a runner event means to the ledger.
fn change(event: &rpb::ExecEvent) -> Option<ProcessChange> {
    Some(match event.event.as_ref()? {
        exec_event::Event::Started(_) => ProcessChange::Started,
        exec_event::Event::Output(out) => ProcessChange::Output {
            stream: if out.stream() == rpb::OutputStream::Stderr {
                "stderr"
            } else {
                "stdout"
            },
            data: out.data.clone(),
        },
        // The runner dropped output, to keep its log within bounds, before
        // it was read: the gap is marked where it is.
        exec_event::Event::Truncated(t) => ProcessChange::Truncated {
            log_bytes: t.dropped_bytes,
        },
        exec_event::Event::Exited(exit) => ProcessChange::Exited(ProcessExit {
            code: exit.exit_code,
            reason: match exit.reason() {
                rpb::ExitReason::Killed => ExitReason::Killed,
                rpb::ExitReason::TimedOut => ExitReason::TimedOut,
                rpb::ExitReason::ContainerLost => ExitReason::ContainerLost,
                rpb::ExitReason::NoResources => ExitReason::NoResources,
                rpb::ExitReason::Exited | rpb::ExitReason::Unspecified => ExitReason::Exited,
            },
            detail: exit.detail.clone(),
        }),
    })
}

fn internal(e: SessionError) -> Status {
    Status::internal(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(event: exec_event::Event) -> rpb::ExecEvent {
        rpb::ExecEvent {
            sequence: 1,
            event: Some(event),
            ..Default::default()
        }
    }

    fn output(stream: rpb::OutputStream, data: &[u8]) -> rpb::ExecEvent {
        let mut out = rpb::Output {
            data: data.to_vec(),
            ..Default::default()
        };
        out.set_stream(stream);
        event(exec_event::Event::Output(out))
    }

    fn exited(code: i32, reason: rpb::ExitReason) -> Option<ProcessChange> {
        let mut exit = rpb::Exited {
            exit_code: code,
            detail: "why".to_owned(),
            ..Default::default()
        };
        exit.set_reason(reason);
        change(&event(exec_event::Event::Exited(exit)))
    }

    fn chunk(sequence: u64) -> (rpb::ExecEvent, OutputChunk) {
        let mut event = output(rpb::OutputStream::Stdout, &[sequence as u8; 8]);
        event.sequence = sequence;
        let chunk = OutputChunk {
            runner_seq: sequence,
            stream: "stdout",
            data: vec![sequence as u8; 8],
        };
        (event, chunk)
    }

    #[test]
    fn a_run_takes_what_the_watch_holds_in_rising_order_and_stops_at_the_rest() {
        let (_, first) = chunk(2);
        let repeated = chunk(3).0;
        let started = event(exec_event::Event::Started(rpb::Started::default()));
        // In order, then one out of order: the run stops before it.
        let events = vec![Ok(chunk(3).0), Ok(repeated.clone()), Ok(chunk(4).0)];
        let run = output_run(first.clone(), &mut futures::stream::iter(events));
        assert_eq!(run.chunks, vec![first.clone(), chunk(3).1]);
        assert_eq!(run.next, Some(repeated));
        assert!(run.end.is_none());
        // Another kind of event ends it too; the watch's end is kept.
        let run = output_run(
            first.clone(),
            &mut futures::stream::iter(vec![Ok(started.clone())]),
        );
        assert_eq!((run.chunks.len(), run.next), (1, Some(started)));
        let run = output_run(first.clone(), &mut futures::stream::iter(Vec::new()));
        assert!(matches!(run.end, Some(Ok(()))));
        // It never waits: a watch with nothing ready ends the run at once.
        let run = output_run(first, &mut futures::stream::pending());
        assert_eq!(
            (run.chunks.len(), run.next, run.end.is_none()),
            (1, None, true)
        );
    }

    #[test]
    fn an_event_without_a_body_means_nothing() {
        assert_eq!(change(&rpb::ExecEvent::default()), None);
    }

    #[test]
    fn a_start_and_a_truncation_map_to_their_changes() {
        let started = event(exec_event::Event::Started(rpb::Started::default()));
        assert_eq!(change(&started), Some(ProcessChange::Started));
        let truncated = event(exec_event::Event::Truncated(rpb::Truncated {
            first_kept_sequence: 9,
            dropped_bytes: 4096,
        }));
        assert_eq!(
            change(&truncated),
            Some(ProcessChange::Truncated { log_bytes: 4096 })
        );
    }

    #[test]
    fn output_keeps_its_stream_and_bytes_and_an_unknown_stream_is_stdout() {
        for (stream, name) in [
            (rpb::OutputStream::Stdout, "stdout"),
            (rpb::OutputStream::Stderr, "stderr"),
            (rpb::OutputStream::Unspecified, "stdout"),
        ] {
            assert_eq!(
                change(&output(stream, b"hi\n")),
                Some(ProcessChange::Output {
                    stream: name,
                    data: b"hi\n".to_vec()
                })
            );
        }
    }

    #[test]
    fn each_exit_reason_maps_to_its_ledger_name() {
        for (reason, name) in [
            (rpb::ExitReason::Exited, ExitReason::Exited),
            (rpb::ExitReason::Killed, ExitReason::Killed),
            (rpb::ExitReason::TimedOut, ExitReason::TimedOut),
            (rpb::ExitReason::ContainerLost, ExitReason::ContainerLost),
            (rpb::ExitReason::NoResources, ExitReason::NoResources),
            (rpb::ExitReason::Unspecified, ExitReason::Exited),
        ] {
            assert_eq!(
                exited(3, reason),
                Some(ProcessChange::Exited(ProcessExit {
                    code: 3,
                    reason: name,
                    detail: "why".to_owned(),
                }))
            );
        }
    }
}
