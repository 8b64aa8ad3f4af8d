//! `troupe session watch`: streams events, one line each (JSON lines with
//! `--json`), until Ctrl-C. When the service goes away (a restart, a lost
//! connection), the watch is opened again after the last cursor seen, on the
//! next endpoint first when there are several, so nothing is missed and
//! nothing repeated; a refusal (an expired cursor, a filter the caller may
//! not use) ends it, telling the last cursor on stderr so it can resume with
//! `--after`.

use std::time::Duration;

use tonic::{Code, Status, Streaming};
use troupe_proto::{
    failover::Endpoints,
    session::{SessionEvent, WatchSessionsRequest},
    status::{kind_str, status_str},
};

use crate::{
    Ctx,
    cli::WatchArgs,
    connect::Client,
    error::{self, Reported},
    out, render, safe,
};

/// The longest wait between two attempts to open a watch again.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

pub async fn run(ctx: &mut Ctx, args: &WatchArgs) -> anyhow::Result<()> {
    let mut request = WatchSessionsRequest {
        session_id: args.session.clone().unwrap_or_default(),
        tree_id: args.tree.clone().unwrap_or_default(),
        workspace_id: args.workspace.clone().unwrap_or_default(),
        after: args.after.clone(),
        live_only: args.live,
        ..Default::default()
    };
    // An error of the call itself (a bad filter, an expired cursor) has no resume point.
    let mut events = open(&ctx.endpoints, &request).await?;
    let mut last = (!args.live && !args.after.is_empty()).then(|| args.after.clone());
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let failure = loop {
        let event = tokio::select! {
            _ = &mut interrupted => {
                if let Some(cursor) = &last {
                    eprintln!("stopped; resume with --after '{cursor}'");
                }
                return Ok(());
            }
            event = events.message() => event,
        };
        let broken = match event {
            Ok(Some(event)) => {
                let written = if ctx.json {
                    out::json_line(&render::event(&event))
                } else {
                    out::text(&line(&event))
                };
                if let Err(err) = written {
                    break err;
                }
                last = Some(event.cursor);
                continue;
            }
            // The server ends its streams when it shuts down.
            Ok(None) => Status::unavailable("the server ended the stream"),
            Err(status) => status,
        };
        if !went_away(&broken) {
            break broken.into();
        }
        match &last {
            Some(cursor) => {
                eprintln!(
                    "the watch broke ({}); resuming after cursor {cursor}",
                    safe::line(broken.message())
                );
                request.after = cursor.clone();
                request.live_only = false;
            }
            None => eprintln!(
                "the watch broke ({}); watching again",
                safe::line(broken.message())
            ),
        }
        // Its server may be stopping: another endpoint is tried first.
        ctx.endpoints.move_on();
        tokio::select! {
            _ = &mut interrupted => return Ok(()),
            reopened = reopen(&ctx.endpoints, &request) => match reopened {
                Ok(stream) => events = stream,
                Err(status) => break status.into(),
            },
        }
    };
    if error::is_broken_pipe(&failure) {
        return Err(failure);
    }
    error::report(&failure, ctx.json, &ctx.setting);
    match last {
        Some(cursor) => eprintln!("last cursor: {cursor}; resume with --after '{cursor}'"),
        None => eprintln!("no event was received; watch again with --live"),
    }
    Err(Reported.into())
}

/// Whether a watch ended because the service went away (it restarts, the
/// connection was lost), not because it refused something: then it is
/// worth opening again.
pub fn went_away(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled
    )
}

/// Opens the watch `request` describes, on the first endpoint that can be reached.
pub async fn open(
    endpoints: &Endpoints<Client>,
    request: &WatchSessionsRequest,
) -> Result<Streaming<SessionEvent>, Status> {
    endpoints
        .call(request, |mut c, m| async move { c.watch_sessions(m).await })
        .await
}

/// Opens the watch `request` describes, trying again while no endpoint
/// answers, a little longer between each round (up to [`MAX_BACKOFF`]).
pub async fn reopen(
    endpoints: &Endpoints<Client>,
    request: &WatchSessionsRequest,
) -> Result<Streaming<SessionEvent>, Status> {
    let mut pause = Duration::from_millis(200);
    loop {
        tokio::time::sleep(pause).await;
        match open(endpoints, request).await {
            Ok(stream) => return Ok(stream),
            Err(status) if went_away(&status) => pause = (pause * 2).min(MAX_BACKOFF),
            Err(status) => return Err(status),
        }
    }
}

/// Returns an event as `sequence kind session_id status depth detail` (its
/// sequence among its session's events; the cursor, up to a pair per
/// shard, is in `--json` and on stderr when the watch stops).
pub fn line(event: &SessionEvent) -> String {
    format!(
        "{} {:<10} {} {:<10} {} {}",
        event.sequence,
        kind_str(event.kind()),
        event.session_id,
        status_str(event.status()),
        event.depth,
        render::event_detail_text(event.detail.as_ref()),
    )
    .trim_end()
    .to_owned()
}

#[cfg(test)]
mod tests {
    use troupe_proto::session::{EventKind, SessionStatus, Terminated, session_event::Detail};

    use super::*;

    #[test]
    fn event_line_has_sequence_kind_session_status_depth_detail() {
        let event = SessionEvent {
            cursor: "22:420".into(),
            sequence: 42,
            kind: EventKind::Terminated as i32,
            session_id: "sess_1".into(),
            status: SessionStatus::Terminated as i32,
            depth: 1,
            detail: Some(Detail::Terminated(Terminated {
                reason: "cascade".into(),
                terminated_by: "operator".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        assert_eq!(
            line(&event),
            "42 terminated sess_1 terminated 1 reason=cascade by=operator"
        );
    }
}
