//! What a console tree's snapshot reads from the store, on both backends:
//! each session's inbox (received, delivered through which sequence,
//! unread) and last progress report in one query, a workspace's or a
//! page's sessions' (and their accounts); a delivery's single
//! `delivered` event, written with it and only when it advances; and the
//! refused spawns of a workspace's sessions, after an audit cursor, newest
//! first, bounded.

use troupe_session_svc::{
    cursor::Cursor,
    error::QuotaLeft,
    model::{
        Action, AuditRecord, EventFilter, EventKind, NewMessage, Principal, ProcessChange,
        ProgressReport, SessionActivity, SessionId, Trust,
    },
    shard::ShardSet,
    store::{EventPage, Fence, Holder, prelude::*},
};
use troupe_tests::stores::{new_session, operator_audit};

async fn fence<S: Store>(store: &S) -> Fence {
    store
        .acquire_lease(&Holder::generate(), std::time::Duration::from_secs(3600))
        .await
        .expect("lease")
        .expect("lease free")
}

async fn send<S: Store>(store: &S, to: &str, n: u32) {
    store
        .send_message(
            &to.into(),
            NewMessage {
                message_id: format!("msg_{to}_{n}"),
                sender: Principal::Operator,
                body: format!("message {n}"),
            },
            None,
            operator_audit(Action::SendMessage, to),
            troupe_tests::stores::UNBOUNDED,
            &|_| Ok(()),
        )
        .await
        .expect("send");
}

async fn activity<S: Store>(store: &S, id: &str) -> SessionActivity {
    store
        .workspace_activity(&"alpha".into())
        .await
        .expect("activity")
        .into_iter()
        .find(|a| a.session_id == id)
        .unwrap_or_else(|| panic!("{id} has no activity"))
}

/// The events of `id` after `after`, as (kind, detail).
async fn events_of<S: Store>(store: &S, id: &str, after: &Cursor) -> Vec<(EventKind, String)> {
    let filter = EventFilter {
        session_id: Some(id.into()),
        ..Default::default()
    };
    let EventPage::Events(rows) = store.events_after(&filter, after, 1000).await.unwrap() else {
        panic!("events expired")
    };
    rows.into_iter().map(|e| (e.kind, e.detail)).collect()
}

/// Messages of `id` whose `delivered_at_ms` is unset, as the rows say.
async fn unread_rows<S: Store>(store: &S, id: &str) -> usize {
    let messages = store.session_messages(&id.into(), 1000).await.unwrap();
    messages
        .iter()
        .filter(|m| m.session_id == id && m.delivered_at_ms.is_none())
        .count()
}

async fn inbox_contract<S: Store>(store: S) {
    let fence = fence(&store).await;
    let root = |_| Ok(QuotaLeft::default());
    for (id, workspace) in [("sess_a", "alpha"), ("sess_b", "alpha"), ("sess_z", "beta")] {
        let mut new = new_session(id, Trust::Sandboxed);
        new.workspace_id = workspace.into();
        new.initial_message = Some(NewMessage {
            message_id: format!("msg_{id}_0"),
            sender: Principal::Operator,
            body: "start".to_owned(),
        });
        store
            .create_root(
                new,
                None,
                operator_audit(Action::CreateRootSession, id),
                &root,
            )
            .await
            .unwrap();
    }
    send(&store, "sess_a", 1).await;
    send(&store, "sess_a", 2).await;

    // One query gives the workspace's sessions alone.
    let all = store.workspace_activity(&"alpha".into()).await.unwrap();
    let mut ids: Vec<_> = all.iter().map(|a| a.session_id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["sess_a", "sess_b"]);
    let a = activity(&store, "sess_a").await;
    assert_eq!((a.received, a.delivered_through, a.unread()), (3, 0, 3));
    assert_eq!(a.progress, None);
    assert_eq!(store.unread_count(&"sess_a".into()).await.unwrap(), 3);

    store
        .record_progress(
            &"sess_a".into(),
            ProgressReport {
                progress: 40,
                description: "half way".into(),
            },
            operator_audit(Action::ReportProgress, "sess_a"),
            &|_| Ok(()),
        )
        .await
        .unwrap();
    let expected = Some(ProgressReport {
        progress: 40,
        description: "half way".to_owned(),
    });
    assert_eq!(activity(&store, "sess_a").await.progress, expected);

    // The agent is handed messages 1 and 2: one event for the two.
    troupe_tests::embedded_runner(&store, &fence).await;
    store.start_process(&fence, &"sess_a".into()).await.unwrap();
    store
        .record_process(&fence, &"sess_a".into(), 1, ProcessChange::Started, 64)
        .await
        .unwrap();
    let before = store.event_heads().await.unwrap().live(ShardSet::ALL);
    store
        .mark_delivered(&fence, &"sess_a".into(), 2)
        .await
        .unwrap();
    let delivered = events_of(&store, "sess_a", &before).await;
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert_eq!(delivered[0].0, EventKind::Delivered);
    let detail: serde_json::Value = serde_json::from_str(&delivered[0].1).unwrap();
    assert_eq!(detail, serde_json::json!({"through_sequence": 2}));
    let a = activity(&store, "sess_a").await;
    assert_eq!((a.received, a.delivered_through, a.unread()), (3, 2, 1));
    assert_eq!(store.unread_count(&"sess_a".into()).await.unwrap(), 1);
    assert_eq!(unread_rows(&store, "sess_a").await, 1, "the rows agree");
    assert_eq!(a.progress, expected, "the progress stays");

    // The same delivery again advances nothing and says nothing.
    let before = store.event_heads().await.unwrap().live(ShardSet::ALL);
    store
        .mark_delivered(&fence, &"sess_a".into(), 2)
        .await
        .unwrap();
    assert_eq!(events_of(&store, "sess_a", &before).await, []);
    store
        .mark_delivered(&fence, &"sess_a".into(), 3)
        .await
        .unwrap();
    let last = events_of(&store, "sess_a", &before).await;
    assert_eq!(
        last.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        [EventKind::Delivered]
    );
    assert_eq!(activity(&store, "sess_a").await.unread(), 0);
    assert_eq!(store.unread_count(&"sess_a".into()).await.unwrap(), 0);
    assert_eq!(unread_rows(&store, "sess_a").await, 0);
    let b = activity(&store, "sess_b").await;
    assert_eq!(
        (b.received, b.unread()),
        (1, 1),
        "another's inbox untouched"
    );

    // A page's sessions alone, in one query each: their activity, as the
    // workspace's read gives it, and their accounts, as one by one.
    let page = ["sess_a", "sess_z", "sess_none"].map(SessionId::from);
    let mut some = store.sessions_activity(&page).await.unwrap();
    some.sort_by(|x, y| x.session_id.cmp(&y.session_id));
    let ids: Vec<_> = some.iter().map(|a| a.session_id.as_str()).collect();
    assert_eq!(ids, ["sess_a", "sess_z"], "those that exist");
    assert_eq!(some[0], activity(&store, "sess_a").await);
    let accounts = store.accounts(&page).await.unwrap();
    let mut ids: Vec<_> = accounts.iter().map(|a| a.session_id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["sess_a", "sess_z"]);
    for account in &accounts {
        let one = store
            .account(&account.session_id.as_str().into())
            .await
            .unwrap();
        assert_eq!(format!("{one:?}"), format!("{:?}", Some(account)));
    }
    assert!(store.sessions_activity(&[]).await.unwrap().is_empty());
    assert!(store.accounts(&[]).await.unwrap().is_empty());
}

fn refusal(target: &str, action: Action, allowed: bool) -> AuditRecord {
    AuditRecord {
        caller: Principal::Session(target.into()),
        action,
        target: target.to_owned(),
        allowed,
        reason: if allowed { "OK" } else { "DEPTH_EXCEEDED" }.to_owned(),
        detail: format!("{action} by {target}"),
    }
}

async fn refused_contract<S: Store>(store: S) {
    let root = |_| Ok(QuotaLeft::default());
    for (id, workspace) in [("sess_a", "alpha"), ("sess_z", "beta")] {
        let mut new = new_session(id, Trust::Sandboxed);
        new.workspace_id = workspace.into();
        store
            .create_root(
                new,
                None,
                operator_audit(Action::CreateRootSession, id),
                &root,
            )
            .await
            .unwrap();
    }
    for record in [
        refusal("sess_a", Action::CreateSession, false),
        refusal("sess_a", Action::CreateSession, true),
        refusal("sess_a", Action::SendMessage, false),
        refusal("sess_z", Action::CreateSession, false),
        refusal("sess_a", Action::CreateSession, false),
    ] {
        store.append_audit(record).await.unwrap();
    }
    let (rows, cursor) = store.refused_spawns(&"alpha".into(), 0, 10).await.unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows.iter()
            .all(|r| !r.allowed && r.action == "create_session" && r.target == "sess_a")
    );
    assert!(rows[0].id > rows[1].id, "newest first");
    assert!(cursor >= rows[0].id);
    let (newest, _) = store.refused_spawns(&"alpha".into(), 0, 1).await.unwrap();
    assert_eq!(newest.len(), 1);
    assert_eq!(newest[0].id, rows[0].id, "the bound keeps the newest");
    // After the cursor: only what came since.
    assert!(
        store
            .refused_spawns(&"alpha".into(), cursor, 10)
            .await
            .unwrap()
            .0
            .is_empty()
    );
    store
        .append_audit(refusal("sess_a", Action::CreateSession, false))
        .await
        .unwrap();
    let (new, next) = store
        .refused_spawns(&"alpha".into(), cursor, 10)
        .await
        .unwrap();
    assert_eq!(new.len(), 1);
    assert!(new[0].id > cursor && next >= new[0].id);
}

#[tokio::test]
async fn inbox_progress_and_refusals_on_sqlite() {
    let (_dir, store) = troupe_tests::stores::sqlite().await;
    inbox_contract(store.clone()).await;
    let (_dir, store) = troupe_tests::stores::sqlite().await;
    refused_contract(store).await;
}

#[tokio::test]
async fn inbox_progress_and_refusals_on_postgres() {
    let store = troupe_tests::stores::postgres().await;
    inbox_contract(store.clone()).await;
    let store = troupe_tests::stores::postgres().await;
    refused_contract(store).await;
}
