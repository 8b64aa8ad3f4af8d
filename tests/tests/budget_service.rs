//! Budgets through the session service, on the backend
//! `TROUPE_TEST_BACKEND` names (`scripts/test` runs it again on
//! PostgreSQL): a budget given at creation shows in `GetSession` with its
//! usage; a create under a spent budget, or asking a wider one, is refused
//! BUDGET_EXCEEDED with what is left in `ErrorInfo`, and audited; a
//! wall-clock budget ends its subtree with end reason `budget`. The store's
//! rules of reservations and settlements are in `budgets.rs`.

use std::time::{Duration, Instant};

use troupe_proto::session::{self as pb, ListAuditRequest};
use troupe_tests::{TestServer, child, error_metadata, reason};

fn budget(
    cost: Option<u64>,
    tokens: Option<u64>,
    calls: Option<u64>,
    wall_ms: Option<u64>,
) -> Option<pb::Budget> {
    Some(pb::Budget {
        cost_pico_usd: cost,
        tokens,
        model_calls: calls,
        wall_ms,
    })
}

async fn root_with(server: &TestServer, budget: Option<pb::Budget>) -> (pb::Session, String) {
    troupe_tests::gateway::root_of(server, "alpha", budget).await
}

/// Through the service: the root's budget shows in GetSession with its
/// usage; a child asking more than is left is refused BUDGET_EXCEEDED and
/// one asking exactly that is made; under a spent budget (no model call
/// allowed) a create is refused BUDGET_EXCEEDED, RESOURCE_EXHAUSTED, with
/// what is left in ErrorInfo, and audited.
#[tokio::test]
async fn create_under_a_spent_budget_is_refused_with_what_is_left() {
    let server = TestServer::start().await;
    let (root_session, token) = root_with(
        &server,
        budget(Some(2_500_000_000_000), Some(1_000), None, None),
    )
    .await;
    let got = server
        .get(&root_session.session_id)
        .await
        .session
        .expect("session");
    let shown = got.budget.expect("budget");
    assert_eq!(shown.cost_pico_usd, Some(2_500_000_000_000));
    assert_eq!((shown.tokens, shown.model_calls), (Some(1_000), None));
    assert_eq!(
        got.usage.expect("usage"),
        pb::SessionUsage {
            own_tokens: Some(pb::TokenCounts::default()),
            ..Default::default()
        }
    );
    let mut agent = server.client(Some(&token)).await;
    let wide = pb::CreateSessionRequest {
        budget: budget(None, Some(1_001), None, None),
        ..child("wide")
    };
    let refused = agent.create_session(wide).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert_eq!(reason(&refused), "BUDGET_EXCEEDED");
    assert_eq!(
        error_metadata(&refused, "tokens_remaining").as_deref(),
        Some("1000")
    );
    let fits = pb::CreateSessionRequest {
        budget: budget(None, Some(1_000), Some(0), None),
        ..child("fits")
    };
    let made = agent.create_session(fits).await.expect("made").into_inner();
    let made = made.session.expect("session");
    assert_eq!(made.budget.expect("budget").tokens, Some(1_000));
    // `fits` may make no model call: its budget is spent from the start.
    let fits_token = server.token_for(&made.session_id).await;
    let mut fits_agent = server.client(Some(&fits_token)).await;
    let refused = fits_agent
        .create_session(child("under a spent budget"))
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert_eq!(reason(&refused), "BUDGET_EXCEEDED");
    let meta = |key| error_metadata(&refused, key);
    assert_eq!(meta("budget_session_id"), Some(made.session_id.clone()));
    assert_eq!(meta("budget_dimension").as_deref(), Some("model_calls"));
    assert_eq!(meta("model_calls_remaining").as_deref(), Some("0"));
    assert_eq!(meta("tokens_remaining").as_deref(), Some("1000"));
    assert_eq!(
        meta("cost_pico_usd_remaining").as_deref(),
        Some("2500000000000")
    );
    let audit = server
        .operator()
        .await
        .list_audit(ListAuditRequest {
            session_id: made.session_id.clone(),
            ..Default::default()
        })
        .await
        .expect("audit")
        .into_inner();
    assert!(
        audit
            .entries
            .iter()
            .any(|e| e.action == "create_session" && !e.allowed && e.reason == "BUDGET_EXCEEDED"),
        "{:?}",
        audit.entries
    );
    server.stop().await;
}

/// A wall-clock budget on a root: once it runs out, the owner of the
/// background work ends the root and every session below it, end reason
/// `budget`, and audits it; a child's deadline is its parent's when its own
/// would come later.
#[tokio::test]
async fn a_wall_clock_budget_ends_its_subtree_with_reason_budget() {
    let server = TestServer::start().await;
    let (root_session, token) = root_with(&server, budget(None, None, None, Some(1_500))).await;
    let mut agent = server.client(Some(&token)).await;
    let made = agent
        .create_session(pb::CreateSessionRequest {
            budget: budget(None, None, None, Some(60_000)),
            ..child("child")
        })
        .await
        .expect("child")
        .into_inner()
        .session
        .expect("session");
    let root_view = server
        .get(&root_session.session_id)
        .await
        .session
        .expect("root");
    assert_eq!(
        made.deadline, root_view.deadline,
        "the earlier deadline is the parent's"
    );
    let child_token = server.token_for(&made.session_id).await;
    let mut child_agent = server.client(Some(&child_token)).await;
    let grandchild = troupe_tests::create_child(&mut child_agent, child("grandchild")).await;
    // Still running before the deadline.
    assert!(root_view.ended_at.is_none());
    let deadline = Instant::now() + Duration::from_secs(20);
    let ids = [
        &root_session.session_id,
        &made.session_id,
        &grandchild.session_id,
    ];
    loop {
        let mut ended = 0;
        for id in ids {
            let s = server.get(id).await.session.expect("session");
            if s.status() == pb::SessionStatus::Terminated {
                assert_eq!(s.end_reason, "budget", "{id}");
                ended += 1;
            }
        }
        if ended == ids.len() {
            break;
        }
        assert!(Instant::now() < deadline, "the subtree did not end");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let audit = server
        .operator()
        .await
        .list_audit(ListAuditRequest {
            session_id: root_session.session_id.clone(),
            ..Default::default()
        })
        .await
        .expect("audit")
        .into_inner();
    let entry = audit
        .entries
        .iter()
        .find(|e| e.action == "end_for_budget")
        .expect("audited");
    assert_eq!(
        (entry.caller.as_str(), entry.reason.as_str()),
        ("troupe", "BUDGET_EXCEEDED")
    );
    for id in ids {
        assert!(entry.detail.contains(id.as_str()), "{}", entry.detail);
    }
    // And nothing more is created under it.
    let refused = agent
        .create_session(child("late"))
        .await
        .expect_err("refused");
    assert!(
        matches!(
            reason(&refused).as_str(),
            "TOKEN_REVOKED" | "PARENT_NOT_RUNNING"
        ),
        "{refused:?}"
    );
    server.stop().await;
}
