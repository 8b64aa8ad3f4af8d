//! The session service driving the runner, both real: sessions start their
//! agents, statuses follow the processes, output and exits reach the ledger
//! and its watchers, messages reach stdin, termination stops processes,
//! execution modes, and trust between agents in the container. Restarts and
//! outages of either side are in `restarts.rs`.

use crate::common;

use std::time::Duration;

use common::{pair::*, *};
use tokio_stream::StreamExt;
use troupe_proto::session::{
    self as pb, CreateSessionRequest, DeliveryStatus, EventKind, ExecutionMode, SendMessageRequest,
    SessionStatus, TerminateSessionRequest, TrustLevel, session_event::Detail,
};

mod lives;
mod modes;
mod trust;
