//! The runner against a real Docker engine: environment, output, exit,
//! stdin, timeout, termination, the container going away, limits, the
//! isolation of sessions, restarts, and the requests it refuses.

use crate::common;

use std::time::Duration;

use common::*;
use tonic::Code;
use troupe_proto::runner::{
    ExecState, ExitReason, ListExecsRequest, OutputStream, StartExecRequest, TerminateExecRequest,
    WriteStdinRequest, exec_event,
};

mod containment;
mod ending;
mod io;
mod nothing_lost;
mod refusals;
