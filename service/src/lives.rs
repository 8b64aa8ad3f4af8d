//! Each session's life, exported as a span when the session ends: the span
//! planned when the session was created
//! ([`LifeSpan`](troupe_telemetry::LifeSpan)), from its creation
//! to its end, under the spawn span that made it. So a spawn tree is one
//! trace, and its nesting in a trace view is the tree.
//!
//! The messages a session received are its life span's events. A message
//! from off the recipient's branch (a sender that is neither its ancestor
//! nor its descendant, in this tree or another) is also a link to the
//! sender's life.
//!
//! [`export`] follows the event feed for the events that end a session,
//! from where the feed was when the service started (before it reconciled
//! anything).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::{
    KeyValue,
    trace::{Event, Link},
};
use tokio_util::sync::CancellationToken;
use troupe_telemetry::Life;

use crate::{
    cursor::Cursor,
    error::SessionError,
    model::{EndReason, EventFilter, SessionId, SessionRow},
    store::{EventPage, Store},
};

/// Most messages recorded on one life span (the SDK's default event limit).
const MAX_MESSAGES: u32 = 128;
/// Events read from the feed at a time.
const PAGE: u32 = 256;

/// Exports the life span of every traced session that ends after the
/// event `cursor`, until `cancel`; then what had ended by then.
pub async fn export<S: Store>(store: S, mut cursor: Cursor, cancel: CancellationToken) {
    let mut changes = store.subscribe_ends();
    loop {
        // Marked seen before the read, so a commit during it wakes the next.
        changes.borrow_and_update();
        if let Err(e) = export_ended(&store, &mut cursor).await {
            tracing::warn!(error = %e, "cannot read the event feed");
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            () = cancel.cancelled() => break,
        }
    }
    if let Err(e) = export_ended(&store, &mut cursor).await {
        tracing::warn!(error = %e, "cannot read the event feed");
    }
}

/// Exports the lives of the sessions that ended after `cursor`, and moves
/// it past them.
async fn export_ended<S: Store>(store: &S, cursor: &mut Cursor) -> Result<(), SessionError> {
    let ends = EventFilter {
        ends_only: true,
        ..EventFilter::default()
    };
    loop {
        match store.events_after(&ends, cursor, PAGE).await? {
            // Ends pruned before they were read are not exported.
            EventPage::Expired {
                shard,
                pruned_through,
            } => cursor.advance(shard, pruned_through),
            EventPage::Events(events) if events.is_empty() => return Ok(()),
            EventPage::Events(events) => {
                for event in events {
                    cursor.advance(event.shard, event.position);
                    if let Err(e) = export_one(store, &event.session_id).await {
                        tracing::warn!(session = %event.session_id, error = %e, "life span not exported");
                    }
                }
            }
        }
    }
}

/// Exports one ended session's life span, if it is traced.
async fn export_one<S: Store>(store: &S, session_id: &SessionId) -> Result<(), SessionError> {
    let Some(row) = store.get_session(session_id).await? else {
        return Ok(());
    };
    let (Some(life), Some(ended_at_ms)) = (row.trace, row.ended_at_ms) else {
        return Ok(());
    };
    let status = troupe_proto::status::status_str(row.status);
    let mut attributes = vec![
        KeyValue::new("gen_ai.operation.name", "invoke_agent"),
        KeyValue::new("gen_ai.agent.id", row.session_id.to_string()),
        KeyValue::new("gen_ai.agent.name", row.agent_name.clone()),
        KeyValue::new("troupe.session.id", row.session_id.to_string()),
        KeyValue::new("troupe.tree.id", row.tree_id.to_string()),
        KeyValue::new("troupe.depth", i64::from(row.depth)),
        KeyValue::new("troupe.workspace.id", row.workspace_id.to_string()),
        KeyValue::new("troupe.trust_level", row.trust.as_str()),
        KeyValue::new("troupe.session.status", status),
    ];
    if let Some(parent) = &row.parent_session_id {
        attributes.push(KeyValue::new(
            "troupe.parent_session.id",
            parent.to_string(),
        ));
    }
    if let Some(reason) = &row.end_reason {
        attributes.push(KeyValue::new("troupe.end_reason", reason.to_string()));
    }
    if let Some(code) = store.process(session_id).await?.and_then(|p| p.exit_code) {
        attributes.push(KeyValue::new("troupe.exit_code", i64::from(code)));
    }
    let (events, links) = messages(store, &row).await?;
    let failed = status == "failed";
    life.export(Life {
        name: format!("invoke_agent {}", row.agent_name),
        start: at(row.created_at_ms),
        end: at(ended_at_ms),
        attributes,
        events,
        links,
        error: failed.then(|| {
            row.end_reason
                .as_ref()
                .map_or_else(|| status.to_owned(), EndReason::to_string)
        }),
    });
    Ok(())
}

/// The messages `row` received, as span events, and links to the lives of
/// their senders off its branch.
async fn messages<S: Store>(
    store: &S,
    row: &SessionRow,
) -> Result<(Vec<Event>, Vec<Link>), SessionError> {
    let mut events = Vec::new();
    let mut links = Vec::new();
    for message in store.received(&row.session_id, MAX_MESSAGES).await? {
        let attributes = vec![
            KeyValue::new("troupe.message.id", message.message_id.clone()),
            KeyValue::new("troupe.message.sequence", message.seq as i64),
            KeyValue::new("troupe.message.sender", message.sender.to_string()),
        ];
        events.push(Event::new(
            "message",
            at(message.created_at_ms),
            attributes,
            0,
        ));
        let Some(sender) = message.sender.session_id() else {
            continue;
        };
        let Some(sender) = store.get_session(sender).await? else {
            continue;
        };
        if let Some(sender_life) = sender.trace
            && !on_one_branch(store, row, &sender).await?
        {
            links.push(Link::new(
                sender_life.span_context(),
                vec![KeyValue::new("troupe.message.id", message.message_id)],
                0,
            ));
        }
    }
    Ok((events, links))
}

/// Whether one of `a` and `b` is an ancestor of the other (or they are one).
async fn on_one_branch<S: Store>(
    store: &S,
    a: &SessionRow,
    b: &SessionRow,
) -> Result<bool, SessionError> {
    if a.tree_id != b.tree_id {
        return Ok(false);
    }
    let (deep, shallow) = if a.depth >= b.depth { (a, b) } else { (b, a) };
    let mut current = deep.clone();
    while current.depth > shallow.depth {
        let Some(parent) = &current.parent_session_id else {
            return Ok(false);
        };
        match store.get_session(parent).await? {
            Some(row) => current = row,
            None => return Ok(false),
        }
    }
    Ok(current.session_id == shallow.session_id)
}

fn at(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}
