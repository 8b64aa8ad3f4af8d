//! The Parachute trust matrix, as one table: for each caller and target,
//! whether the caller sees, lists, messages and may create what it asks.

use tonic::Code;
use troupe_proto::session::{self as pb, TrustLevel};
use troupe_tests::{TestServer, child, get, message, reason};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Who {
    Direct,
    Sandboxed,
    DirectOtherWorkspace,
    SandboxedOtherWorkspace,
}

/// (caller, target, may see/list/message)
const VISIBILITY: &[(Who, Who, bool)] = &[
    (Who::Direct, Who::Direct, true),
    (Who::Direct, Who::Sandboxed, true),
    (Who::Direct, Who::DirectOtherWorkspace, false),
    (Who::Direct, Who::SandboxedOtherWorkspace, false),
    (Who::Sandboxed, Who::Direct, false),
    (Who::Sandboxed, Who::Sandboxed, true),
    (Who::Sandboxed, Who::DirectOtherWorkspace, false),
    (Who::Sandboxed, Who::SandboxedOtherWorkspace, false),
];

#[tokio::test]
async fn trust_matrix_holds_for_see_list_message_and_create() {
    let server = TestServer::start().await;
    // Callers are roots of workspace "alpha"; targets are other roots.
    let (_, direct, _) = server.root("alpha", TrustLevel::Direct).await;
    let (_, sandboxed, _) = server.root("alpha", TrustLevel::Sandboxed).await;
    let mut targets = Vec::new();
    for (who, ws, trust) in [
        (Who::Direct, "alpha", TrustLevel::Direct),
        (Who::Sandboxed, "alpha", TrustLevel::Sandboxed),
        (Who::DirectOtherWorkspace, "beta", TrustLevel::Direct),
        (Who::SandboxedOtherWorkspace, "beta", TrustLevel::Sandboxed),
    ] {
        let (session, _, _) = server.root(ws, trust).await;
        targets.push((who, session.session_id));
    }

    for &(caller, target, allowed) in VISIBILITY {
        let mut client = match caller {
            Who::Direct => direct.clone(),
            Who::Sandboxed => sandboxed.clone(),
            _ => unreachable!("callers are in alpha"),
        };
        let id = &targets
            .iter()
            .find(|(w, _)| *w == target)
            .expect("target")
            .1;
        let case = format!("{caller:?} -> {target:?}");

        let get = client.get_session(get(id.clone())).await;
        assert_eq!(get.is_ok(), allowed, "get {case}: {get:?}");
        if let Err(status) = &get {
            assert_eq!(status.code(), Code::NotFound, "get {case}");
        }

        let listed = client
            .list_workspace_sessions(pb::ListWorkspaceSessionsRequest::default())
            .await
            .expect("list")
            .into_inner()
            .sessions
            .iter()
            .any(|s| &s.session_id == id);
        assert_eq!(listed, allowed, "list {case}");

        let sent = client.send_message(message(id.clone(), "hello")).await;
        assert_eq!(sent.is_ok(), allowed, "message {case}: {sent:?}");
        if let Err(status) = &sent {
            assert_eq!(status.code(), Code::NotFound, "message {case}");
        }
    }

    // Create: (caller, requested trust, expected child trust or refusal reason)
    let create_cases: &[(Who, TrustLevel, Result<TrustLevel, &str>)] = &[
        (Who::Direct, TrustLevel::Unspecified, Ok(TrustLevel::Direct)),
        (Who::Direct, TrustLevel::Direct, Ok(TrustLevel::Direct)),
        (
            Who::Direct,
            TrustLevel::Sandboxed,
            Ok(TrustLevel::Sandboxed),
        ),
        (
            Who::Sandboxed,
            TrustLevel::Unspecified,
            Ok(TrustLevel::Sandboxed),
        ),
        (
            Who::Sandboxed,
            TrustLevel::Sandboxed,
            Ok(TrustLevel::Sandboxed),
        ),
        (Who::Sandboxed, TrustLevel::Direct, Err("TRUST_ESCALATION")),
    ];
    for &(caller, requested, expected) in create_cases {
        let mut client = if caller == Who::Direct {
            direct.clone()
        } else {
            sandboxed.clone()
        };
        let result = client
            .create_session(pb::CreateSessionRequest {
                trust_level: requested as i32,
                ..child("create case")
            })
            .await;
        let case = format!("{caller:?} creates {requested:?}");
        match (result, expected) {
            (Ok(response), Ok(level)) => {
                let session = response.into_inner().session.expect("session");
                assert_eq!(session.trust_level, level as i32, "{case}");
                assert_eq!(
                    session.workspace_id, "alpha",
                    "{case}: child stays in the workspace"
                );
            }
            (Err(status), Err(why)) => {
                assert_eq!(status.code(), Code::PermissionDenied, "{case}");
                assert_eq!(reason(&status), why, "{case}");
            }
            (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
        }
    }

    // Naming another workspace's session as parent is refused before anything is looked up.
    let other = &targets[2].1;
    let status = direct
        .clone()
        .create_session(pb::CreateSessionRequest {
            parent_session_id: other.clone(),
            ..child("cross")
        })
        .await
        .expect_err("agents cannot name a parent");
    assert_eq!(reason(&status), "PARENT_OVERRIDE_FORBIDDEN");

    // A sandboxed caller sees direct children of nobody: a sandboxed child of
    // a direct parent shows no parent id to a sandboxed viewer.
    let (_, mut lead, _) = server.root("gamma", TrustLevel::Direct).await;
    let kid = lead
        .create_session(pb::CreateSessionRequest {
            trust_level: TrustLevel::Sandboxed as i32,
            ..child("kid")
        })
        .await
        .expect("sandboxed child")
        .into_inner()
        .session
        .expect("session");
    let mut as_kid = server.act_as(&kid.session_id).await;
    let seen = as_kid
        .get_session(get(kid.session_id.clone()))
        .await
        .expect("sees itself")
        .into_inner()
        .session
        .expect("session");
    assert_eq!(seen.parent_session_id, "", "direct parent id is hidden");
    assert_eq!(seen.created_by, "session", "direct creator id is hidden");
    server.stop().await;
}

#[tokio::test]
async fn trust_comes_from_the_token_not_the_request() {
    let server = TestServer::start().await;
    let (_, mut sandboxed, _) = server.root("alpha", TrustLevel::Sandboxed).await;
    let (direct, _, _) = server.root("alpha", TrustLevel::Direct).await;
    // Asking to list another workspace, or to be treated as direct, changes nothing.
    let status = sandboxed
        .list_workspace_sessions(pb::ListWorkspaceSessionsRequest {
            workspace_id: "beta".into(),
            ..Default::default()
        })
        .await
        .expect_err("other workspace");
    assert_eq!(status.code(), Code::NotFound);
    let mut request = tonic::Request::new(get(direct.session_id.clone()));
    request
        .metadata_mut()
        .insert("x-trust-level", "direct".parse().expect("ascii"));
    let status = sandboxed.get_session(request).await.expect_err("hidden");
    assert_eq!(status.code(), Code::NotFound);
    server.stop().await;
}
