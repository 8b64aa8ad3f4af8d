//! `troupe-mcp agent RUNTIME`: runs an agent CLI as a member of its team.
//! An agent definition that names a `runtime` runs this, in the workspace
//! container, with the definition's prompt and model in its environment
//! ([`troupe_proto::agent::runtime`]). It composes what the CLI needs in a
//! folder of the agent's private `HOME` ([`context`]): the gateway as its
//! only model provider, Troupe's MCP server (this program) in the CLI's own
//! configuration format, the system prompt (the definition's, then the team
//! context), and then runs it:
//!
//! - [`claude_code`]: one process, messages written to it as they come;
//! - [`codex`] (`app-server`) and [`opencode`] (`serve`): one process, a
//!   message joining the running turn or starting the next;
//! - [`gemini`], [`aider`]: one run per turn, the conversation resumed, the
//!   messages that came during a turn making the next ([`turns`]); Aider,
//!   which has no MCP client, finishes its session with its last answer.
//!
//! Each reads Troupe's messages through a bounded [`inbox`]. What the CLI
//! prints is the session's output, as it comes.

mod aider;
mod claude_code;
mod codex;
pub mod context;
mod gemini;
mod inbox;
mod opencode;
mod turns;

use troupe_proto::agent::Runtime;

use self::context::Context;

/// Runs `runtime` until Troupe's stdin ends (or, for a leaf worker, its
/// task is finished); returns the exit code.
pub async fn run(runtime: Runtime) -> anyhow::Result<i32> {
    let ctx = Context::from_env(runtime)?;
    match runtime {
        Runtime::ClaudeCode => claude_code::run(&ctx).await,
        Runtime::Codex => codex::run(&ctx).await,
        Runtime::GeminiCli => turns::run(&ctx, &mut gemini::Gemini::default()).await,
        Runtime::OpenCode => opencode::run(&ctx).await,
        Runtime::Aider => turns::run(&ctx, &mut aider::Aider::default()).await,
    }
}
