//! The protocol of Troupe: generated gRPC code for `troupe.session.v1` and
//! `troupe.runner.v1`, plus the hand-written helpers that go with it.
//!
//! - [`session`]: the session service (spawn tree ledger).
//! - [`runner`]: the runner service (agent processes in workspace containers).
//! - [`trust`]: text forms of trust levels, with the `trusted`/`untrusted` aliases.
//! - [`status`]: text forms of session statuses and event kinds.
//! - [`paths`]: the default data directory and the operator token.
//! - [`names`]: the rule for workspace ids and agent names.
//! - [`codec`]: tonic-prost's codec, but an undecodable request is `INVALID_ARGUMENT`.
//! - [`endpoint`]: channels to `http://` and `unix://` endpoints.
//! - [`serving`]: reflection and health descriptors, and the stop signal, of every server.
//! - [`drain`]: how every server stops: NOT_SERVING first, streams ended, a bounded drain.
//! - [`refusal`]: a refused call's code, message, `ErrorInfo` reason and metadata, as text.
//! - [`telemetry`]: logs on stderr and OpenTelemetry span export, set by `OTEL_*` variables.
//! - [`FILE_DESCRIPTOR_SET`]: what server reflection serves.

/// `troupe.session.v1`.
pub mod session {
    tonic::include_proto!("troupe.session.v1");
}

/// `troupe.runner.v1`.
pub mod runner {
    tonic::include_proto!("troupe.runner.v1");
}

pub mod codec;
pub mod drain;
pub mod endpoint;
pub mod names;
pub mod paths;
pub mod refusal;
pub mod serving;
pub mod status;
pub mod telemetry;
pub mod trust;

/// Encoded descriptors of both services, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("troupe_descriptor");

/// The `google.rpc.ErrorInfo` domain of every Troupe refusal.
pub const ERROR_DOMAIN: &str = "troupe";
