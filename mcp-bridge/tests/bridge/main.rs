//! `troupe-mcp` driven by a real MCP client, the official Python SDK
//! (`tests/mcp_client.py`), against a real session service in this process:
//! over stdio through the service's Unix socket, and as the shared HTTP
//! endpoint with each request's bearer token. Needs `python3` with
//! `mcp` 2.x installed; without it these tests fail, saying how to install it.
//!
//! `schema`: the tools a client lists; `team`: a team made through the
//! tools, and a wait across a restart; `http`: the shared endpoint, each
//! request as its own token's session.

use crate::common;

mod http;
mod schema;
mod team;

use common::*;
use serde_json::json;
use troupe_proto::session::TrustLevel;
use troupe_tests::{TestServer, get, terminate};
