//! The gRPC face of the runner: `troupe.runner.v1.RunnerService`.
//!
//! Only the session service (and operators) call it: every call carries the
//! operator token.

use std::{pin::Pin, sync::Arc, time::Duration};

use futures::Stream;
use subtle::ConstantTimeEq;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::Instrument;
use troupe_proto::runner::{
    self as pb, ExecEvent, ExecInfo, ExecState, ListExecsRequest, ListExecsResponse,
    StartExecRequest, StartExecResponse, TerminateExecRequest, TerminateExecResponse,
    WatchExecRequest, WriteStdinRequest, WriteStdinResponse, exec_event,
    runner_service_server::RunnerService,
};

use crate::{
    exec::{Exec, ExecError, Frame, Next, Place, Runner, StartSpec},
    log::{Exit, Kind},
    request::stdin_input,
};

fn frames(frames: Vec<pb::StdinFrame>) -> Vec<Frame> {
    frames
        .into_iter()
        .map(|f| Frame {
            sequence: f.sequence,
            data: f.data,
        })
        .collect()
}

/// Default grace between SIGTERM and SIGKILL.
const DEFAULT_GRACE: Duration = Duration::from_millis(5000);
/// Events buffered per watcher; beyond them the watcher waits.
const WATCH_BUFFER: usize = 16;

pub struct Service {
    runner: Arc<Runner>,
    operator_token: String,
}

impl Service {
    pub fn new(runner: Arc<Runner>, operator_token: String) -> Self {
        Service {
            runner,
            operator_token,
        }
    }

    fn authorize<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let presented = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| Status::unauthenticated("missing bearer token"))?;
        if bool::from(presented.as_bytes().ct_eq(self.operator_token.as_bytes())) {
            Ok(())
        } else {
            Err(Status::unauthenticated("invalid token"))
        }
    }
}

impl From<ExecError> for Status {
    fn from(e: ExecError) -> Self {
        match e {
            ExecError::Invalid(m) => Status::invalid_argument(m),
            ExecError::AlreadyExists(_) => Status::already_exists(e.to_string()),
            ExecError::NotFound(_) => Status::not_found(e.to_string()),
            ExecError::Conflict(m) => Status::failed_precondition(m),
            ExecError::OutOfRange(m) => Status::out_of_range(m),
            ExecError::Unavailable(m) => Status::unavailable(m),
            ExecError::NoResources(_) => Status::resource_exhausted(e.to_string()),
            ExecError::Internal(e) => {
                tracing::error!(error = format!("{e:#}"), "runner call failed");
                Status::internal(format!("{e:#}"))
            }
        }
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<ExecEvent, Status>> + Send>>;

#[tonic::async_trait]
impl RunnerService for Service {
    async fn start_exec(
        &self,
        request: Request<StartExecRequest>,
    ) -> Result<Response<StartExecResponse>, Status> {
        self.authorize(&request)?;
        let req = request.into_inner();
        let spec = StartSpec {
            exec_id: req.exec_id,
            workspace_id: req.workspace_id,
            command: req.command,
            env: req.env,
            initial_stdin: stdin_input(req.initial_stdin, frames(req.initial_frames))?,
            working_dir: req.working_dir,
            timeout_ms: req.timeout_ms,
            traceparent: req.traceparent,
            labels: req.labels,
            writable_paths: req.writable_paths,
        };
        // A start goes to its end even if its caller goes away (the session
        // service that asked was killed): dropped half-way, it would leave
        // the id reserved with no exec, so that the next owner's start would
        // be told it exists and its watch that it does not.
        let runner = self.runner.clone();
        let exec = tokio::spawn(async move { runner.start(spec).await }.in_current_span())
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "exec start task failed");
                Status::internal("the exec's start failed")
            })??;
        Ok(Response::new(StartExecResponse {
            exec: Some(info(&exec)),
        }))
    }

    type WatchExecStream = EventStream;

    async fn watch_exec(
        &self,
        request: Request<WatchExecRequest>,
    ) -> Result<Response<Self::WatchExecStream>, Status> {
        self.authorize(&request)?;
        let req = request.into_inner();
        let exec = self.runner.get(&req.exec_id)?;
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let start = exec.progress();
        // Refuse a bad cursor before the stream starts.
        let mut pos = exec.locate_after(req.after_sequence, &start)?;
        let shutdown = self.runner.shutdown_token();
        tokio::spawn(async move {
            let mut seq = req.after_sequence;
            let mut progress = exec.subscribe();
            loop {
                let now = progress.borrow_and_update().clone();
                while seq < now.last_sequence {
                    let event = match exec.next_record(seq, pos) {
                        Ok(Next::Record(header, payload)) => {
                            pos += header.record_len();
                            seq += 1;
                            event(&exec, seq, header, payload)
                        }
                        Ok(Next::Dropped(head)) => {
                            seq = head.sequence - 1;
                            pos = head.offset;
                            Ok(truncated(&exec, head))
                        }
                        Err(e) => Err(Status::from(e)),
                    };
                    let failed = event.is_err();
                    if tx.send(event).await.is_err() || failed {
                        return;
                    }
                    exec.ack(pos, seq >= now.last_sequence);
                    exec.read_to(seq, pos);
                }
                if now.exit.is_some() {
                    return;
                }
                tokio::select! {
                    changed = progress.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                    () = tx.closed() => return,
                    () = shutdown.cancelled() => {
                        let _ = tx
                            .send(Err(Status::unavailable(
                                "the runner is shutting down; reconnect and resume after the last sequence",
                            )))
                            .await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn write_stdin(
        &self,
        request: Request<WriteStdinRequest>,
    ) -> Result<Response<WriteStdinResponse>, Status> {
        self.authorize(&request)?;
        let req = request.into_inner();
        let input = stdin_input(req.data, frames(req.frames))?;
        let exec = self.runner.get(&req.exec_id)?;
        let stdin_sequence = self.runner.write_stdin(&exec, input, req.close).await?;
        Ok(Response::new(WriteStdinResponse { stdin_sequence }))
    }

    async fn terminate_exec(
        &self,
        request: Request<TerminateExecRequest>,
    ) -> Result<Response<TerminateExecResponse>, Status> {
        self.authorize(&request)?;
        let req = request.into_inner();
        let exec = self.runner.get(&req.exec_id)?;
        let grace = match req.grace_ms {
            0 => DEFAULT_GRACE,
            ms => Duration::from_millis(ms),
        };
        self.runner.terminate(&exec, grace).await?;
        Ok(Response::new(TerminateExecResponse {
            exec: Some(info(&exec)),
        }))
    }

    async fn list_execs(
        &self,
        request: Request<ListExecsRequest>,
    ) -> Result<Response<ListExecsResponse>, Status> {
        self.authorize(&request)?;
        let req = request.into_inner();
        let workspace = (!req.workspace_id.is_empty()).then_some(req.workspace_id.as_str());
        let execs = self
            .runner
            .list(workspace)
            .iter()
            .map(|e| info(e))
            .collect();
        Ok(Response::new(ListExecsResponse { execs }))
    }
}

fn event(
    exec: &Exec,
    sequence: u64,
    header: crate::log::Header,
    payload: Vec<u8>,
) -> Result<ExecEvent, Status> {
    let corrupt = |e: crate::log::Corrupt| Status::data_loss(e.to_string());
    let event = match header.kind {
        Kind::Started => exec_event::Event::Started(pb::Started {
            container_id: exec.meta.container_id.clone(),
            pid: crate::log::decode_started(&payload).map_err(corrupt)?,
        }),
        Kind::Stdout | Kind::Stderr => exec_event::Event::Output(pb::Output {
            stream: if header.kind == Kind::Stdout {
                pb::OutputStream::Stdout
            } else {
                pb::OutputStream::Stderr
            } as i32,
            data: payload,
        }),
        // The runner's account of the end, which may correct the log's.
        Kind::Exited => exec_event::Event::Exited(exited(&match exec.progress().exit {
            Some(exit) => exit,
            None => crate::log::decode_exit(&payload).map_err(corrupt)?,
        })),
    };
    Ok(ExecEvent {
        exec_id: exec.meta.exec_id.clone(),
        sequence,
        at: Some(timestamp(header.at_micros)),
        event: Some(event),
    })
}

/// The event that stands for the records before `head`, dropped.
fn truncated(exec: &Exec, head: Place) -> ExecEvent {
    ExecEvent {
        exec_id: exec.meta.exec_id.clone(),
        sequence: head.sequence - 1,
        at: Some(timestamp(crate::log::now_micros())),
        event: Some(exec_event::Event::Truncated(pb::Truncated {
            first_kept_sequence: head.sequence,
            dropped_bytes: head.offset,
        })),
    }
}

fn exited(exit: &Exit) -> pb::Exited {
    pb::Exited {
        exit_code: exit.code,
        reason: exit.reason as i32,
        detail: exit.detail.clone(),
    }
}

fn timestamp(micros: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: (micros / 1_000_000) as i64,
        nanos: ((micros % 1_000_000) * 1000) as i32,
    }
}

/// What `ListExecs` and the other replies say of an exec.
pub fn info(exec: &Exec) -> ExecInfo {
    let progress = exec.progress();
    ExecInfo {
        exec_id: exec.meta.exec_id.clone(),
        workspace_id: exec.meta.workspace_id.clone(),
        state: if progress.exit.is_some() {
            ExecState::Exited
        } else {
            ExecState::Running
        } as i32,
        last_sequence: progress.last_sequence,
        started_at: Some(timestamp(exec.meta.started_at_micros)),
        exit: progress.exit.as_ref().map(exited),
        labels: exec.meta.labels.clone(),
        stdin_sequence: exec.stdin_sequence(),
    }
}
