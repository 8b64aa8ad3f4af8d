//! `WatchSessions`: replays stored events after the cursor, then follows new
//! ones. Every event is read back from the store in each shard's order (the
//! live signal only says "there is more", and only for the shards the watch
//! covers), so a watcher neither misses nor repeats an event, and a
//! reconnect with the last cursor resumes exactly (`troupe_domain::cursor`). A watch
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
    cursor::{Cursor, CursorError},
    error::{Reason, SessionError},
    model::{Caller, EventFilter, EventRow},
    policy::{self, can_see},
    shard::{Shard, ShardSet},
    store::{EventPage, Store},
};

const PAGE: u32 = 256;

pub async fn start<S: Store>(
    inner: Arc<Inner<S>>,
    caller: &Caller,
    lapse: Lapse,
    req: &pb::WatchSessionsRequest,
) -> Result<EventStream, SessionError> {
    #[allow(deprecated)] // read only to refuse it
    let numeric = req.after_cursor;
    if numeric != 0 {
        return Err(SessionError::invalid(
            "after_cursor",
            "numeric cursors are no longer accepted: the event log is ordered per shard, and \
             a cursor is the `cursor` text of the last event received, passed as `after`; \
             start again from the oldest event kept (no cursor) or the live end (`live_only`)",
        ));
    }
    let resumed: Cursor = req
        .after
        .parse()
        .map_err(|e: CursorError| SessionError::invalid("after", e.to_string()))?;
    let filter = filter(&inner, caller, req).await?;
    let shards = filter.shard().map_or(ShardSet::ALL, ShardSet::of);
    // Subscribed before anything is read, so no commit falls between the two.
    let mut changes = inner.store.subscribe(shards);
    changes.borrow_and_update();
    // The first page is read before answering, so an expired cursor is the call's error.
    let (mut after, first) = if req.live_only {
        let after = inner.store.event_heads().await?.live(shards);
        (after, Vec::new())
    } else if req.after.trim().is_empty() {
        from_oldest(&inner.store, &filter, shards).await?
    } else {
        let after = resumed.within(shards);
        match inner.store.events_after(&filter, &after, PAGE).await? {
            EventPage::Events(events) => (after, events),
            EventPage::Expired {
                shard,
                pruned_through,
            } => return Err(expired(shard, pruned_through)),
        }
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
                after.advance(event.shard, event.position);
                if tx
                    .send(Ok(view::event(&caller, event, &after)))
                    .await
                    .is_err()
                {
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
            page = match inner.store.events_after(&filter, &after, PAGE).await {
                Ok(EventPage::Events(events)) => events,
                Ok(EventPage::Expired {
                    shard,
                    pruned_through,
                }) => {
                    let _ = tx.send(Err(expired(shard, pruned_through).into())).await;
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

/// The cursor before the oldest events kept, and the first page after it.
/// A pruning that passes the marks between the two reads moves them on:
/// a watch from the oldest starts at what is kept, whenever that is.
async fn from_oldest<S: Store>(
    store: &S,
    filter: &EventFilter,
    shards: ShardSet,
) -> Result<(Cursor, Vec<EventRow>), SessionError> {
    let mut tries = 0;
    loop {
        let after = store.event_heads().await?.oldest_kept(shards);
        match store.events_after(filter, &after, PAGE).await? {
            EventPage::Events(events) => return Ok((after, events)),
            EventPage::Expired {
                shard,
                pruned_through,
            } if tries == 3 => return Err(expired(shard, pruned_through)),
            EventPage::Expired { .. } => tries += 1,
        }
    }
}

fn expired(shard: Shard, pruned_through: i64) -> SessionError {
    SessionError::refused(
        Reason::CursorExpired,
        format!(
            "cursor expired: events of shard {shard} up to position {pruned_through} were pruned; \
             watch again without a cursor for the oldest kept"
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
        let row = inner
            .store
            .get_session(id)
            .await?
            .filter(|row| can_see(caller, row))
            .ok_or_else(|| SessionError::not_found(id))?;
        // Its workspace names the one shard to read.
        filter.workspace_id.get_or_insert(row.workspace_id);
    }
    if let (Some(tree), None) = (&filter.tree_id, &filter.workspace_id) {
        // Likewise a tree's (none: no event can match, any shard will do).
        filter.workspace_id = inner.store.tree_workspace(tree).await?;
    }
    Ok(filter)
}
