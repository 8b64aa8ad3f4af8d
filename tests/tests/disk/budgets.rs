//! Agents' output within byte budgets, per session and in total: the
//! oldest dropped first, every drop marked where it happened, and pruning
//! taken off the counts.

use super::*;

/// Every event of `session` after `after`, as a watcher pages through them.
async fn watch(store: &SqliteStore, session: &str, after: &mut Cursor) -> Vec<EventRow> {
    let filter = EventFilter {
        session_id: Some(session.into()),
        ..Default::default()
    };
    let mut all = Vec::new();
    loop {
        let EventPage::Events(page) = store.events_after(&filter, after, 100).await.unwrap() else {
            panic!("cursor {after} expired");
        };
        if page.is_empty() {
            return all;
        }
        for event in &page {
            after.advance(event.shard, event.position);
        }
        all.extend(page);
    }
}

fn data(event: &EventRow) -> Vec<u8> {
    let detail: serde_json::Value = serde_json::from_str(&event.detail).unwrap();
    base64::engine::general_purpose::STANDARD
        .decode(detail["data"].as_str().unwrap())
        .unwrap()
}

/// (dropped bytes, dropped events) of an `output_truncated` event.
fn dropped(event: &EventRow) -> (u64, u64) {
    let detail: serde_json::Value = serde_json::from_str(&event.detail).unwrap();
    (
        detail["dropped_bytes"].as_u64().unwrap(),
        detail["dropped_events"].as_u64().unwrap(),
    )
}

/// What a watcher makes of `events`: the chunk numbers it was sent, and
/// the totals of the last marker it met.
fn read(events: &[EventRow]) -> (Vec<u64>, Option<(u64, u64)>) {
    let mut chunks = Vec::new();
    let mut marker = None;
    for e in events {
        match e.kind.as_str() {
            "output" => {
                let data = data(e);
                let number = std::str::from_utf8(&data[1..7]).unwrap();
                chunks.push(number.parse().unwrap());
            }
            "output_truncated" => marker = Some(dropped(e)),
            _ => {}
        }
    }
    (chunks, marker)
}

#[tokio::test]
async fn output_past_a_sessions_budget_is_dropped_oldest_first_and_the_gap_marked() {
    let dir = tempfile::tempdir().unwrap();
    let budget = OutputBudget {
        session_bytes: 64 << 10,
        total_bytes: 1 << 30,
    };
    let store = open(dir.path(), budget).await;
    running(&store, "sess_loud").await;
    // A watcher that keeps up as it goes; one that read the first ten
    // chunks and went away.
    let mut live = Vec::new();
    let mut after = Cursor::default();
    let mut went_away = Cursor::default();
    for i in 0..300u64 {
        print(&store, "sess_loud", i + 2, output(chunk(i))).await;
        let new = watch(&store, "sess_loud", &mut after).await;
        live.extend(new);
        if i == 9 {
            went_away = after.clone();
        }
    }

    let (seen, _) = read(&live);
    assert_eq!(
        seen,
        (0..300).collect::<Vec<_>>(),
        "a watcher that keeps up is sent every chunk once, in order"
    );

    let all = watch(&store, "sess_loud", &mut Cursor::default()).await;
    let (kept, marker) = read(&all);
    let kinds: Vec<&str> = all.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "output_truncated").count(),
        1,
        "one marker: {kinds:?}"
    );
    let marker_at = kinds.iter().position(|k| *k == "output_truncated").unwrap();
    assert_eq!(
        kinds.iter().position(|k| *k == "output"),
        Some(marker_at + 1),
        "the marker stands where the dropped output stood: {kinds:?}"
    );
    let (bytes, events) = marker.unwrap();
    assert!(
        kept.len() as u64 * 1024 <= budget.session_bytes,
        "{} kept",
        kept.len()
    );
    assert_eq!(
        kept,
        (events..300).collect::<Vec<_>>(),
        "the newest output is kept, whole"
    );
    assert_eq!(bytes, events * 1024);

    // The watcher that went away is told of the gap before any output.
    let resumed = watch(&store, "sess_loud", &mut went_away).await;
    assert_eq!(
        resumed.first().map(|e| e.kind.as_str()),
        Some("output_truncated")
    );
    let (after_gap, marker) = read(&resumed);
    assert_eq!(after_gap, kept);
    assert!(marker.unwrap().1 >= 10, "its totals cover what it missed");
    // One that read everything is sent nothing again.
    assert!(watch(&store, "sess_loud", &mut after).await.is_empty());
}

#[tokio::test]
async fn the_total_budget_takes_from_the_sessions_keeping_the_most() {
    let dir = tempfile::tempdir().unwrap();
    let budget = OutputBudget {
        session_bytes: 1 << 30,
        total_bytes: 64 << 10,
    };
    let store = open(dir.path(), budget).await;
    running(&store, "sess_quiet").await;
    running(&store, "sess_loud").await;
    for i in 0..8 {
        print(&store, "sess_quiet", i + 2, output(chunk(i))).await;
    }
    for i in 0..200 {
        print(&store, "sess_loud", i + 2, output(chunk(i))).await;
    }
    let (quiet, marker) = read(&watch(&store, "sess_quiet", &mut Cursor::default()).await);
    assert_eq!(
        quiet,
        (0..8).collect::<Vec<_>>(),
        "the quiet session keeps its output"
    );
    assert_eq!(marker, None);
    let (loud, marker) = read(&watch(&store, "sess_loud", &mut Cursor::default()).await);
    let (bytes, events) = marker.expect("the loud session's gap is marked");
    assert_eq!(loud, (events..200).collect::<Vec<_>>());
    assert_eq!(bytes, events * 1024);
    assert!(
        (quiet.len() + loud.len()) as u64 * 1024 <= budget.total_bytes,
        "{} + {} chunks kept",
        quiet.len(),
        loud.len()
    );
}

/// Pruning by retention takes what it prunes off the counts, so the
/// budgets keep counting what is stored.
#[tokio::test]
async fn pruned_output_leaves_the_budgets_counts() {
    let dir = tempfile::tempdir().unwrap();
    let budget = OutputBudget {
        session_bytes: 32 << 10,
        total_bytes: 1 << 30,
    };
    let store = open(dir.path(), budget).await;
    running(&store, "sess_a").await;
    for i in 0..100 {
        print(&store, "sess_a", i + 2, output(chunk(i))).await;
    }
    troupe_tests::stores::prune_all(&store, &fence(&store).await, 10).await;
    let mut db = sqlx::SqliteConnection::connect(&db_url(dir.path()))
        .await
        .unwrap();
    let (stored, counted, total): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT COALESCE(SUM(bytes), 0) FROM events WHERE kind = 'output'), \
         (SELECT output_bytes FROM processes WHERE session_id = 'sess_a'), \
         (SELECT SUM(bytes) FROM output_stripes)",
    )
    .fetch_one(&mut db)
    .await
    .unwrap();
    assert_eq!((counted, total), (stored, stored));
    assert_eq!(stored, 10 * 1024, "the ten newest events are output");
}
