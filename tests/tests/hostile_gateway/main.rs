//! The hostile suite of the model gateway's boundaries, on the backend
//! `TROUPE_TEST_BACKEND` names, a real HTTP client against the real
//! service and the scripted upstream: what an agent sends that must not
//! reach the provider (headers, server tools, MCP servers, remote content,
//! a key given twice), what the provider sends back that must not reach
//! the agent (its key, whole or masked, in an answer, a header or a
//! stream; its other headers; a huge error). The bytes a client sends are
//! `hostile_gateway_bytes.rs`; the spending side is
//! `hostile_gateway_spend.rs`.

use serde_json::{Value, json};
use troupe_tests::{
    gateway::*,
    http,
    upstream::{Fault, Turn},
};

mod answers;
mod bodies;
mod headers;
