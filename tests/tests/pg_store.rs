//! `PgStore` against `SqliteStore`: one script of writes (creates, messages,
//! the runner's events with output past its budgets, progress, exits,
//! failures, a cascading termination, pruning) run on both, and everything
//! a caller can read back compared: the events (kind, sequence, status,
//! detail, in cursor order), the session rows, process rows, inboxes, audit.
//!
//! PostgreSQL only: `TROUPE_TEST_POSTGRES_URL` (`source scripts/pg-env`).

use troupe_session_svc::{
    cursor::Cursor,
    error::{QuotaLeft, SessionError},
    model::{
        Action, EventFilter, ExitReason, Failure, NewMessage, NewSession, Principal, ProcessChange,
        ProcessExit, ProgressReport, SessionId, SessionRow, Trust,
    },
    policy::{Admission, SpawnContext},
    shard::{Shard, ShardSet},
    store::{Created, EventPage, OutputBudget, prelude::*},
};
use troupe_tests::stores::{self, operator_audit as audit};

fn new_session(id: &str, initial: Option<&str>) -> NewSession {
    NewSession {
        title: format!("title of {id}"),
        initial_message: initial.map(|body| NewMessage {
            message_id: format!("msg_{id}_0"),
            sender: Principal::Operator,
            body: body.to_owned(),
        }),
        notify_parent: id == "a1",
        ..stores::new_session(id, Trust::Direct)
    }
}

fn admit(ctx: &SpawnContext<'_>) -> Result<Admission, SessionError> {
    Ok(Admission {
        depth: ctx.parent.depth + 1,
        parent_spawn_tat_ms: ctx.parent.spawn_tat_ms + 7,
        quota: QuotaLeft {
            tree_sessions_remaining: 100 - ctx.tree_sessions,
            depth_remaining: 9,
            children_remaining: 100 - ctx.children,
        },
        deadline_ms: None,
    })
}

fn output(data: &str) -> ProcessChange {
    ProcessChange::Output {
        stream: "stdout",
        data: data.as_bytes().to_vec(),
    }
}

/// A session row without what differs by nature between two databases
/// (times, the random tree id).
fn comparable(row: &SessionRow) -> String {
    let mut row = row.clone();
    row.created_at_ms = 0;
    row.ended_at_ms = row.ended_at_ms.map(|_| 0);
    row.tree_id = Default::default();
    format!("{row:?}")
}

/// Runs the script; returns what a caller reads back, as text lines.
async fn script<S: Store>(store: &S) -> Vec<String> {
    let fence = stores::lease_fence(store).await;
    let mut seen = Vec::new();
    let root_quota = |_| Ok(QuotaLeft::default());
    store
        .create_root(
            new_session("root", Some("hello")),
            None,
            audit(Action::CreateRootSession, "root"),
            &root_quota,
        )
        .await
        .expect("root");
    for (id, parent) in [("a", "root"), ("b", "root"), ("a1", "a"), ("a2", "a")] {
        let created = store
            .create_child(
                &parent.into(),
                new_session(id, Some("do it")),
                None,
                audit(Action::CreateSession, id),
                &admit,
            )
            .await
            .expect("child");
        match created {
            Created::New { session, quota } => {
                seen.push(format!("{} {quota:?}", comparable(&session)));
            }
            Created::Replayed { .. } => panic!("no request id here"),
        }
    }
    for (i, to) in ["a", "a", "b"].iter().enumerate() {
        let sent = store
            .send_message(
                &SessionId::from(*to),
                NewMessage {
                    message_id: format!("m{i}"),
                    sender: Principal::Session("root".into()),
                    body: format!("body {i} ✓"),
                },
                None,
                audit(Action::SendMessage, to),
                troupe_tests::stores::UNBOUNDED,
                &|_| Ok(()),
            )
            .await
            .expect("send");
        seen.push(format!("{sent:?}"));
    }
    troupe_tests::embedded_runner(store, &fence).await;
    for id in ["a", "b", "a1"] {
        store
            .start_process(&fence, &id.into())
            .await
            .expect("start");
        store
            .record_process(&fence, &id.into(), 1, ProcessChange::Started, 64)
            .await
            .expect("started");
    }
    // Output past a's budget (100 bytes), and past the total (120).
    for n in 0..12u64 {
        let id = ["a", "a", "b"][n as usize % 3];
        let row = store
            .record_process(
                &fence,
                &id.into(),
                2 + n,
                output(&format!("{id} chunk {n:02} ....")),
                64,
            )
            .await
            .expect("output");
        seen.push(format!("{:?}", row.map(|r| comparable(&r))));
    }
    let unknown = store
        .record_process(&fence, &"nobody".into(), 1, ProcessChange::Started, 64)
        .await
        .expect_err("no such session");
    seen.push(format!("unknown: {unknown}"));
    // Applied once: the same runner sequence again is nothing.
    let again = store
        .record_process(&fence, &"a".into(), 2, output("again"), 64)
        .await
        .expect("again");
    seen.push(format!("again: {again:?}"));
    store
        .record_process(
            &fence,
            &"b".into(),
            30,
            ProcessChange::Truncated { log_bytes: 999 },
            64,
        )
        .await
        .expect("truncated");
    let progress = store
        .record_progress(
            &"a1".into(),
            ProgressReport {
                progress: 33,
                description: "step 1 of 3".into(),
            },
            audit(Action::ReportProgress, "a1"),
            &|_| Ok(()),
        )
        .await
        .expect("progress");
    seen.push(format!("progress seq {progress}"));
    store
        .mark_delivered(&fence, &"a".into(), 2)
        .await
        .expect("mark delivered");
    for (id, code, reason) in [("b", 0, ExitReason::Exited), ("a1", 3, ExitReason::Exited)] {
        let exit = ProcessChange::Exited(ProcessExit {
            code,
            reason,
            detail: "done".to_owned(),
        });
        let row = store
            .record_process(&fence, &id.into(), 40, exit, 64)
            .await
            .expect("exit");
        seen.push(format!("{:?}", row.map(|r| comparable(&r))));
    }
    let failed = store
        .fail_session(
            &fence,
            &"a2".into(),
            Failure::NoResources,
            "no room",
            audit(Action::RunnerLost, "a2"),
        )
        .await
        .expect("fail");
    seen.push(format!("a2 failed: {failed}"));
    let (ended, row) = store
        .terminate(
            &"root".into(),
            &Principal::Operator,
            "enough",
            audit(Action::TerminateSession, "root"),
            &|_, _| Ok(()),
        )
        .await
        .expect("terminate");
    seen.push(format!("terminated {ended:?} {}", comparable(&row)));
    // An exit after the end changes nothing but the process row.
    let late = ProcessChange::Exited(ProcessExit {
        code: 143,
        reason: ExitReason::Killed,
        detail: String::new(),
    });
    let row = store
        .record_process(&fence, &"a".into(), 50, late, 64)
        .await
        .expect("late");
    seen.push(format!("{:?}", row.map(|r| comparable(&r))));

    // What a caller reads back.
    for id in ["root", "a", "b", "a1", "a2"] {
        let row = store
            .get_session(&id.into())
            .await
            .expect("get")
            .expect("stored");
        seen.push(comparable(&row));
        let children: Vec<SessionId> = store
            .children(&id.into())
            .await
            .expect("children")
            .iter()
            .map(|r| r.session_id.clone())
            .collect();
        seen.push(format!("children of {id}: {children:?}"));
        seen.push(format!(
            "inbox {}",
            store.inbox_count(&id.into()).await.expect("inbox")
        ));
        seen.push(format!(
            "{:?}",
            store.process(&id.into()).await.expect("process")
        ));
        seen.push(format!(
            "{:?}",
            store.undelivered(&id.into()).await.expect("undelivered")
        ));
        let received: Vec<_> = store
            .received(&id.into(), 10)
            .await
            .expect("received")
            .into_iter()
            .map(|m| (m.seq, m.message_id, m.sender))
            .collect();
        seen.push(format!("{received:?}"));
    }
    let (page, next) = store
        .list_workspace(&"alpha".into(), false, true, 0, 3)
        .await
        .expect("list");
    seen.push(format!(
        "list {:?} more {}",
        page.iter()
            .map(|r| r.session_id.clone())
            .collect::<Vec<_>>(),
        next.is_some()
    ));
    let mut counts = store.active_counts().await.expect("counts");
    counts.sort_by_key(|(w, t, _)| (w.clone(), t.as_str()));
    seen.push(format!("{counts:?}"));
    seen.extend(events(store, &EventFilter::default()).await);
    seen.extend(
        events(
            store,
            &EventFilter {
                ends_only: true,
                ..EventFilter::default()
            },
        )
        .await,
    );
    let audit: Vec<_> = store
        .list_audit(Some(&"a".into()), 0, 100)
        .await
        .expect("audit")
        .into_iter()
        .map(|a| (a.action, a.target, a.allowed, a.detail))
        .collect();
    seen.push(format!("{audit:?}"));
    // Pruning: the oldest go, and a cursor before them has expired.
    // (Every session is in alpha: its shard's positions are 1, 2, ...)
    let shard = Shard::of("alpha");
    let newest = store.event_heads().await.expect("heads").newest(shard);
    let marks = stores::prune_all(store, &fence, 5).await;
    let pruned = marks[usize::from(shard.index())];
    assert_eq!(pruned, newest - 5);
    match store
        .events_after(&EventFilter::default(), &Cursor::at([(shard, 1)]), 100)
        .await
        .expect("page")
    {
        EventPage::Expired {
            shard: expired,
            pruned_through,
        } => assert_eq!((expired, pruned_through), (shard, pruned)),
        EventPage::Events(events) => panic!("expected CURSOR_EXPIRED, got {events:?}"),
    }
    seen.extend(events(store, &EventFilter::default()).await);
    seen
}

/// Every event the filter passes, as lines (id relative to the first).
async fn events<S: Store>(store: &S, filter: &EventFilter) -> Vec<String> {
    let mut out = Vec::new();
    let mut after = store
        .event_heads()
        .await
        .expect("heads")
        .oldest_kept(ShardSet::ALL);
    loop {
        let EventPage::Events(page) = store.events_after(filter, &after, 4).await.expect("page")
        else {
            panic!("expired");
        };
        if page.is_empty() {
            return out;
        }
        for e in &page {
            let detail: serde_json::Value = serde_json::from_str(&e.detail).expect("json");
            out.push(format!(
                "{} #{} {} {} {} {detail}",
                e.session_id,
                e.seq,
                e.kind,
                troupe_proto::status::status_str(e.status),
                e.depth
            ));
            after.advance(e.shard, e.position);
        }
    }
}

#[tokio::test]
async fn postgres_and_sqlite_stores_answer_the_same_script_alike() {
    let budget = OutputBudget {
        session_bytes: 100,
        total_bytes: 120,
    };
    let (_dir, sqlite) = stores::sqlite().await;
    let sqlite = sqlite.with_output_budget(budget);
    let pg = stores::postgres().await.with_output_budget(budget);
    let on_sqlite = script(&sqlite).await;
    let on_pg = script(&pg).await;
    assert!(
        on_sqlite.iter().any(|l| l.contains("output_truncated")),
        "the script drops output"
    );
    for (i, (s, p)) in on_sqlite.iter().zip(&on_pg).enumerate() {
        assert_eq!(s, p, "line {i} differs");
    }
    assert_eq!(on_sqlite.len(), on_pg.len());
}
