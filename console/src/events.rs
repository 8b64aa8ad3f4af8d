//! `GET /api/events`: `WatchSessions` as Server-Sent Events. Each event's
//! SSE id is its cursor, so a browser's `EventSource` that lost its
//! connection resumes after the last event it received (`Last-Event-ID`),
//! and the page drops any id it has applied already. The stream ends when
//! the watch does (a stop of the service: the browser reconnects and
//! resumes), with an `refused` event when the watch was refused, and with a
//! `signed_out` event once the sign-in it was opened with has ended.

use std::{convert::Infallible, sync::Arc, time::Duration};

use axum::{
    extract::{Query, State},
    http::{HeaderMap, HeaderValue, header},
    response::{
        IntoResponse, Response,
        sse::{Event, KeepAlive, Sse},
    },
};
use futures::StreamExt;
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use troupe_proto::session::{self as pb, session_service_server::SessionService};

use super::{
    Console,
    calls::{ApiError, as_operator},
    json,
};
use troupe_domain::model::now_ms;
use troupe_store::Store;

/// How often an open stream checks that its sign-in still holds.
const SIGN_IN_CHECK: Duration = Duration::from_secs(5);
/// How long a browser waits before it reconnects, in milliseconds.
const RETRY: Duration = Duration::from_millis(1000);

#[derive(Deserialize)]
pub struct EventsQuery {
    #[serde(default)]
    workspace: String,
    #[serde(default)]
    tree: String,
    #[serde(default)]
    session: String,
    /// Where to start when the browser has no `Last-Event-ID` yet (a
    /// cursor; empty: the oldest event kept).
    #[serde(default)]
    after: String,
    /// `false`: leave out agents' output (the tree views need none).
    output: Option<bool>,
}

pub async fn stream<S: Store>(
    State(console): State<Arc<Console<S>>>,
    Query(query): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let signed = console.signed(&headers).await?;
    // The service reads the cursor, and refuses one that is not.
    let after = match headers.get("last-event-id") {
        Some(id) => id
            .to_str()
            .map_err(|_| ApiError::invalid("Last-Event-ID is not a cursor"))?
            .to_owned(),
        None => query.after,
    };
    let request = as_operator(
        console.operator_token(),
        pb::WatchSessionsRequest {
            session_id: query.session,
            tree_id: query.tree,
            workspace_id: query.workspace,
            after,
            ..Default::default()
        },
    )?;
    let mut watch = console.service.watch_sessions(request).await?.into_inner();
    let with_output = query.output.unwrap_or(true);
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(64);
    let id_hash = signed.session.id_hash;
    tokio::spawn(async move {
        let _ = tx
            .send(Ok(Event::default().retry(RETRY).comment("open")))
            .await;
        let mut check = tokio::time::interval(SIGN_IN_CHECK);
        check.tick().await;
        loop {
            let event = tokio::select! {
                next = watch.next() => next,
                _ = check.tick() => {
                    let live = console.inner.store.console_session(&id_hash, now_ms()).await;
                    if !matches!(live, Ok(Some(_))) {
                        let _ = tx.send(Ok(Event::default().event("signed_out").data("{}"))).await;
                        return;
                    }
                    continue;
                }
                () = tx.closed() => return,
            };
            let sse = match event {
                None => return,
                Some(Ok(event)) => {
                    if !with_output && is_output(&event) {
                        continue;
                    }
                    Event::default()
                        .id(event.cursor.clone())
                        .event("session")
                        .data(json::event(&event).to_string())
                }
                // A stop: the browser reconnects and resumes.
                Some(Err(status)) if status.code() == tonic::Code::Unavailable => return,
                Some(Err(status)) => {
                    let refusal = ApiError::from(status);
                    let body = serde_json::json!({
                        "code": refusal.code,
                        "message": refusal.message,
                        "reason": refusal.reason,
                    });
                    let _ = tx
                        .send(Ok(Event::default().event("refused").data(body.to_string())))
                        .await;
                    return;
                }
            };
            if tx.send(Ok(sse)).await.is_err() {
                return;
            }
        }
    });
    let mut response = Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

fn is_output(event: &pb::SessionEvent) -> bool {
    matches!(
        event.kind(),
        pb::EventKind::Output | pb::EventKind::OutputTruncated
    )
}
