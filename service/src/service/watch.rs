//! `WatchSessions`: replays stored events after the cursor, then follows new
//! ones. Every event is read back from the store in cursor order (the live
//! signal only says "there is more"), so a watcher neither misses nor repeats
//! an event, and a reconnect with the last cursor resumes exactly. A watch
//! opened with a session's token ends, UNAUTHENTICATED, once that token
//! would be refused (the session ended, the token expired).

use std::sync::Arc;

use futures::FutureExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use troupe_proto::session as pb;

use super::{EventStream, Inner, identity::Lapse, view};
use crate::{
    error::{Reason, SessionError},
    model::{Caller, EventFilter},
    policy::{self, can_see},
    store::{EventPage, Store},
};

const PAGE: u32 = 256;

pub async fn start<S: Store>(
    inner: Arc<Inner<S>>,
    caller: &Caller,
    lapse: Lapse,
    req: &pb::WatchSessionsRequest,
) -> Result<EventStream, SessionError> {
    let filter = filter(&inner, caller, req).await?;
    // Subscribed before anything is read, so no commit falls between the two.
    let mut changes = inner.store.subscribe();
    let mut after = if req.live_only {
        inner.store.newest_event().await?
    } else {
        i64::try_from(req.after_cursor)
            .map_err(|_| SessionError::invalid("after_cursor", "out of range"))?
    };
    // The first page is read before answering, so an expired cursor is the call's error.
    changes.borrow_and_update();
    let first = match inner.store.events_after(&filter, after, PAGE).await? {
        EventPage::Events(events) => events,
        EventPage::Expired { pruned_through } => return Err(expired(pruned_through)),
    };
    let (tx, rx) = mpsc::channel(64);
    let caller = caller.clone();
    tokio::spawn(async move {
        // The watch ends, refused, as soon as a new call of its caller would be.
        let lapsed = lapse.lapsed(&inner);
        tokio::pin!(lapsed);
        let mut page = first;
        loop {
            if let Some(refusal) = (&mut lapsed).now_or_never() {
                let _ = tx.send(Err(refusal.into())).await;
                return;
            }
            let full = page.len() == PAGE as usize;
            for event in &page {
                after = event.id;
                if tx.send(Ok(view::event(&caller, event))).await.is_err() {
                    return; // the watcher went away
                }
            }
            if !full {
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { return },
                    () = inner.shutdown.cancelled() => {
                        let _ = tx.send(Err(Status::unavailable("the session service is shutting down; resume with the last cursor"))).await;
                        return;
                    }
                    () = tx.closed() => return,
                    refusal = &mut lapsed => {
                        let _ = tx.send(Err(refusal.into())).await;
                        return;
                    }
                }
            }
            changes.borrow_and_update();
            page = match inner.store.events_after(&filter, after, PAGE).await {
                Ok(EventPage::Events(events)) => events,
                Ok(EventPage::Expired { pruned_through }) => {
                    let _ = tx.send(Err(expired(pruned_through).into())).await;
                    return;
                }
                Err(e) => {
                    let _ = tx.send(Err(Status::from(e))).await;
                    return;
                }
            };
        }
    });
    Ok(Box::pin(ReceiverStream::new(rx)))
}

fn expired(pruned_through: i64) -> SessionError {
    SessionError::refused(
        Reason::CursorExpired,
        format!(
            "cursor expired: events up to {pruned_through} were pruned; resume from 0 for the oldest kept"
        ),
    )
}

/// Narrows the request to what the caller may see.
async fn filter<S: Store>(
    inner: &Inner<S>,
    caller: &Caller,
    req: &pb::WatchSessionsRequest,
) -> Result<EventFilter, SessionError> {
    let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    let mut filter = EventFilter {
        session_id: non_empty(&req.session_id).map(Into::into),
        tree_id: non_empty(&req.tree_id).map(Into::into),
        workspace_id: non_empty(&req.workspace_id).map(Into::into),
        ..EventFilter::default()
    };
    if let Caller::Session(_) = caller {
        filter.workspace_id = Some(policy::visible_workspace(caller, &req.workspace_id)?);
        filter.sandboxed_only = policy::sees_only_sandboxed(caller);
    }
    if let Some(id) = &filter.session_id {
        inner
            .store
            .get_session(id)
            .await?
            .filter(|row| can_see(caller, row))
            .ok_or_else(|| SessionError::not_found(id))?;
    }
    Ok(filter)
}
