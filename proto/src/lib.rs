//! The protocol of Troupe: generated gRPC code for `troupe.session.v1` and
//! `troupe.runner.v1`, plus the hand-written helpers that go with it.
//!
//! - [`session`]: the session service (spawn tree ledger).
//! - [`runner`]: the runner service (agent processes in workspace containers).
//! - [`fleet`]: the runners' registration with the session service
//!   (`RegisterRunner`, `ListRunners`): a service of its own, served beside
//!   the session service, so that the session service's file stays the
//!   agents' and the operator's API.
//! - [`trust`]: text forms of trust levels, with the `trusted`/`untrusted` aliases.
//! - [`status`]: text forms of session statuses and event kinds.
//! - [`paths`]: the default data directory and the operator token.
//! - [`names`]: the rule for workspace ids and agent names.
//! - [`scope`]: write scopes, the directories under `/workspace` an agent may write.
//! - [`grpc`]: the servers of gRPC health and server reflection, with that codec.
//! - [`codec`]: tonic-prost's codec, but an undecodable request is `INVALID_ARGUMENT`.
//! - [`endpoint`]: channels to `http://` and `unix://` endpoints.
//! - [`failover`]: several endpoints of one service; a call moves on from one
//!   it cannot reach.
//! - [`serving`]: reflection and health descriptors, and the stop signal, of every server.
//! - [`drain`]: how every server stops: NOT_SERVING first, streams ended, a bounded drain.
//! - [`money`]: exact decimal amounts (USD as pico-dollars, prices).
//! - [`refusal`]: a refused call's code, message, `ErrorInfo` reason and metadata, as text.
//! - [`view`]: the JSON view of a session (and quota) the CLI and the MCP bridge show.
//! - [`agent`]: what an agent is given: its stdin's message lines and `session_ended`
//!   notices, and its environment.
//! - [`FILE_DESCRIPTOR_SET`]: what server reflection serves.

/// `troupe.session.v1`.
pub mod session {
    tonic::include_proto!("troupe.session.v1");
}

/// `troupe.runner.v1`.
pub mod runner {
    tonic::include_proto!("troupe.runner.v1");
}

/// `troupe.fleet.v1`.
pub mod fleet {
    tonic::include_proto!("troupe.fleet.v1");
}

/// The servers of the standard gRPC services every Troupe server serves,
/// generated with [`codec::TroupeCodec`] like Troupe's own. Their messages
/// are tonic-health's and tonic-reflection's, which answer them
/// ([`drain::DrainingHealth`], [`serving::reflection`]).
pub mod grpc {
    /// `grpc.health.v1`.
    pub mod health {
        tonic::include_proto!("grpc.health.v1");
    }

    /// `grpc.reflection.v1` and `grpc.reflection.v1alpha`.
    pub mod reflection {
        /// `grpc.reflection.v1`.
        pub mod v1 {
            tonic::include_proto!("grpc.reflection.v1");
        }

        /// `grpc.reflection.v1alpha`.
        pub mod v1alpha {
            tonic::include_proto!("grpc.reflection.v1alpha");
        }
    }
}

pub mod agent;
pub mod codec;
pub mod drain;
pub mod endpoint;
pub mod failover;
pub mod money;
pub mod names;
pub mod paths;
pub mod refusal;
pub mod scope;
pub mod serving;
pub mod status;
pub mod trust;
pub mod view;

/// Encoded descriptors of both services, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("troupe_descriptor");

/// The `google.rpc.ErrorInfo` domain of every Troupe refusal.
pub const ERROR_DOMAIN: &str = "troupe";
