//! The web console in a real browser (headless Chromium through
//! chromedriver), against a real session service driving a real runner and
//! Docker: signing in, a team's tree growing live, a session's output
//! streaming, a message delivered, a subtree terminated, a node's unread
//! messages counted up and down live, agents' text
//! shown as text, refusals without the cookie or the CSRF token, and a
//! page that resumes after the service restarts without showing an event
//! twice. One browser goes through the steps in turn; a failed step keeps
//! a screenshot (`troupe_tests::browser`). And, in a process that exports
//! spans (so that sessions have trace ids), a session's trace link.

use crate::common;
mod http;

use anyhow::ensure;
use common::pair::*;
use hyper::{Method, StatusCode};
use troupe_proto::session::{ExecutionMode, SessionStatus};
use troupe_tests::{OPERATOR_TOKEN, browser::Browser, otlp::exporting_test, ports::free_addr};

mod live;
mod pages;
mod sessions;
mod sign_in;
mod team;
mod trace;
