//! What an agent is given: the lines of its stdin ([`stdin`]) and its
//! environment ([`env`]). The session service writes them, the runner
//! completes the environment, `troupe-mcp claude-input` and the demo agent
//! read them: all through these types.

pub mod env;
pub mod runtime;
pub mod stdin;

pub use env::AgentEnv;
pub use runtime::Runtime;
pub use stdin::{MessageLine, SessionEnded};
