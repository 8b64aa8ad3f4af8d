//! The commands: `session` subcommands in [`session`] (create, list, get,
//! terminate, token, send), [`tree`] and [`watch`]; the audit log in [`audit`];
//! agent definitions in [`agent`]; runners in [`runner`]; the service's
//! replicas and their shards in [`replica`]; broadcasts and groups in
//! [`group`].

pub mod agent;
pub mod audit;
pub mod group;
pub mod replica;
pub mod runner;
pub mod session;
pub mod tree;
pub mod watch;

use crate::{Ctx, cli::SessionCommand};

/// Runs one `troupe session ...` command.
pub async fn session(ctx: &mut Ctx, command: &SessionCommand) -> anyhow::Result<()> {
    match command {
        SessionCommand::Create(args) => session::create(ctx, args).await,
        SessionCommand::List(args) => session::list(ctx, args).await,
        SessionCommand::Get(args) => session::get(ctx, args).await,
        SessionCommand::Tree(args) => tree::run(ctx, args).await,
        SessionCommand::Terminate(args) => session::terminate(ctx, args).await,
        SessionCommand::Token(args) => session::token(ctx, &args.id).await,
        SessionCommand::Send(args) => session::send(ctx, args).await,
        SessionCommand::Watch(args) => watch::run(ctx, args).await,
    }
}
