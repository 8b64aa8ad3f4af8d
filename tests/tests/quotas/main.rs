//! Every spawn refusal, and the atomicity of the quotas under concurrent
//! spawns: each limit refusing with its reason, what a sandboxed spawner is
//! told, an operator acting for a session, and spawns racing at a limit.

use std::time::Duration;

use futures::future::join_all;
use tonic::Code;
use troupe_proto::session::{self as pb, SessionStatus, TrustLevel};
use troupe_session_svc::Limits;
use troupe_tests::{TestServer, child, create_child, error_metadata, reason, terminate};

mod atomicity;
mod limits;
mod on_behalf;
mod sandboxed;

async fn spawn(
    client: &mut troupe_tests::Client,
    title: &str,
) -> Result<pb::CreateSessionResponse, tonic::Status> {
    client
        .create_session(child(title))
        .await
        .map(|r| r.into_inner())
}
