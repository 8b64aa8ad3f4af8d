//! Idempotent retries, messages and inboxes, cascade termination and its
//! race with spawning, agent definitions, and ids the caller may not see.

use futures::future::join_all;
use tonic::Code;
use troupe_proto::session::{self as pb, SessionStatus, TrustLevel};
use troupe_tests::{TestServer, child, create_child, get, message, reason, terminate};

mod retries;
mod sessions;
