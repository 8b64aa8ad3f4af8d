//! `troupe session tree ID [--subtree] [--follow]`: walks up to the topmost
//! session the caller may see, then down with `GetSession` (which returns
//! direct children), and prints the tree. `--follow` reprints it whenever an
//! event of the tree changes it, until Ctrl-C.

use std::{
    collections::{HashMap, VecDeque},
    io::IsTerminal,
    time::Duration,
};

use anyhow::Context;
use tonic::{Code, Status};
use troupe_proto::{
    failover::Endpoints,
    session::{GetSessionRequest, GetSessionResponse, WatchSessionsRequest},
};

use super::watch;
use crate::{
    Ctx,
    cli::TreeArgs,
    connect::Client,
    out, render, safe,
    tree::{self, Node},
};

/// Events arriving this close together cause one reprint.
const SETTLE: Duration = Duration::from_millis(150);

pub async fn run(ctx: &mut Ctx, args: &TreeArgs) -> anyhow::Result<()> {
    if !args.follow {
        let node = fetch(&ctx.endpoints, &args.id, args.subtree).await?;
        return print(ctx, &node, Print::Once);
    }
    // Watch before reading the tree, so no change in between is missed.
    let tree_id = get(&ctx.endpoints, &args.id)
        .await?
        .session
        .map(|s| s.tree_id)
        .unwrap_or_default();
    let request = WatchSessionsRequest {
        tree_id,
        live_only: true,
        ..Default::default()
    };
    let mut events = watch::open(&ctx.endpoints, &request).await?;
    let mut shown = fetch(&ctx.endpoints, &args.id, args.subtree).await?;
    print(ctx, &shown, Print::First)?;
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        let event = tokio::select! {
            _ = &mut interrupted => return Ok(()),
            event = events.message() => event,
        };
        let broken = match event {
            Ok(Some(_)) => None,
            Ok(None) => Some(Status::unavailable("the server ended the watch")),
            Err(status) => Some(status),
        };
        match broken {
            // The service went away: watch again, then read the tree again,
            // so a change made meanwhile is shown.
            Some(status) if watch::went_away(&status) => {
                eprintln!(
                    "the watch broke ({}); watching again",
                    safe::line(status.message())
                );
                ctx.endpoints.move_on();
                tokio::select! {
                    _ = &mut interrupted => return Ok(()),
                    reopened = watch::reopen(&ctx.endpoints, &request) => events = reopened?,
                }
            }
            Some(status) => return Err(status.into()),
            // Let a burst (a cascade of terminations) settle into one reprint.
            None => {
                while let Ok(Ok(Some(_))) = tokio::time::timeout(SETTLE, events.message()).await {}
            }
        }
        // Messages and output change no line of the tree: no reprint for them.
        let node = fetch(&ctx.endpoints, &args.id, args.subtree).await?;
        if node != shown {
            print(ctx, &node, Print::Again)?;
            shown = node;
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Print {
    /// The only print.
    Once,
    /// The first of a `--follow`.
    First,
    /// A reprint after a change.
    Again,
}

/// Prints a tree. JSON is indented once, one tree a line while following; a
/// text reprint clears a terminal, or is separated from the previous one.
fn print(ctx: &Ctx, node: &Node, when: Print) -> anyhow::Result<()> {
    if ctx.json {
        return match when {
            Print::Once => out::json(&render::tree(node)),
            Print::First | Print::Again => out::json_line(&render::tree(node)),
        };
    }
    if when == Print::Again {
        if std::io::stdout().is_terminal() {
            // The CLI's own control sequence: clear the screen, cursor home.
            out::raw(b"\x1b[2J\x1b[H")?;
        } else {
            out::raw(b"---\n")?;
        }
    }
    out::text(&tree::render(node))
}

/// Returns the tree containing `id` (or, with `subtree`, rooted at it).
async fn fetch(client: &Endpoints<Client>, id: &str, subtree: bool) -> anyhow::Result<Node> {
    let mut answers: HashMap<String, GetSessionResponse> = HashMap::new();
    let start = get(client, id).await?;
    let mut top = id.to_owned();
    let mut parent = parent_of(&start);
    answers.insert(top.clone(), start);
    while let Some(up) = parent.filter(|_| !subtree) {
        if answers.contains_key(&up) {
            break; // a loop in the data; stop climbing
        }
        match get(client, &up).await {
            Ok(answer) => {
                parent = parent_of(&answer);
                answers.insert(up.clone(), answer);
                top = up;
            }
            // An ancestor the caller may not see: the tree starts below it.
            Err(status) if status.code() == Code::NotFound => break,
            Err(status) => return Err(status.into()),
        }
    }
    let mut queue = VecDeque::from([top.clone()]);
    let mut sessions = HashMap::new();
    let mut children = HashMap::new();
    while let Some(next) = queue.pop_front() {
        if sessions.contains_key(&next) {
            continue;
        }
        let answer = match answers.remove(&next) {
            Some(answer) => answer,
            None => match get(client, &next).await {
                Ok(answer) => answer,
                // Ended and gone, or hidden since the parent was read.
                Err(status) if status.code() == Code::NotFound => continue,
                Err(status) => return Err(status.into()),
            },
        };
        let ids: Vec<String> = answer
            .children
            .iter()
            .map(|c| c.session_id.clone())
            .collect();
        queue.extend(ids.iter().cloned());
        children.insert(next.clone(), ids);
        if let Some(session) = answer.session {
            sessions.insert(next, session);
        }
    }
    tree::assemble(&top, &sessions, &children)
        .with_context(|| format!("session {top} vanished while reading the tree"))
}

fn parent_of(answer: &GetSessionResponse) -> Option<String> {
    answer
        .session
        .as_ref()
        .map(|s| s.parent_session_id.clone())
        .filter(|p| !p.is_empty())
}

async fn get(endpoints: &Endpoints<Client>, id: &str) -> Result<GetSessionResponse, tonic::Status> {
    let request = GetSessionRequest {
        session_id: id.to_owned(),
    };
    endpoints
        .call(&request, |mut c, m| async move { c.get_session(m).await })
        .await
}
