//! Write scopes in the spawn tree, on SQLite and on PostgreSQL (the latter
//! needs `TROUPE_TEST_POSTGRES_URL`, `source scripts/pg-env`): a root's
//! scope is the operator's choice, a child inherits its parent's or asks
//! for a narrower one, and nobody, a grandchild or an operator acting on a
//! session's behalf, widens it. The runner is asked for what is stored.

use tonic::Code;
use troupe_proto::session::{self as pb, TrustLevel};
use troupe_tests::{TestServer, child, create_child, postgres::Backend, reason};

fn scoped(title: &str, paths: &[&str]) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        writable_paths: paths.iter().map(|p| (*p).to_owned()).collect(),
        ..child(title)
    }
}

async fn root_scoped(server: &TestServer, paths: &[&str]) -> Result<pb::Session, tonic::Status> {
    root_of(server, TrustLevel::Sandboxed, paths).await
}

async fn root_of(
    server: &TestServer,
    trust: TrustLevel,
    paths: &[&str],
) -> Result<pb::Session, tonic::Status> {
    server
        .operator()
        .await
        .create_root_session(pb::CreateRootSessionRequest {
            workspace_id: "alpha".into(),
            trust_level: trust as i32,
            agent_name: "worker".into(),
            writable_paths: paths.iter().map(|p| (*p).to_owned()).collect(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().session.expect("a session"))
}

async fn a_grandchild_cannot_widen_its_scope(backend: Backend) {
    let server = TestServer::start_on(backend, |_| {}).await;
    let root = root_scoped(&server, &["/workspace/src/", "/workspace/doc"])
        .await
        .expect("a scoped root");
    assert_eq!(
        server.stored_scope(&root.session_id).await,
        ["/workspace/doc", "/workspace/src"]
    );
    let mut as_root = server.act_as(&root.session_id).await;

    // Narrower: allowed; none asked: the parent's scope, inherited.
    let narrow = create_child(&mut as_root, scoped("narrow", &["/workspace/src/lib"])).await;
    assert_eq!(
        server.stored_scope(&narrow.session_id).await,
        ["/workspace/src/lib"]
    );
    assert_eq!(narrow.writable_paths, ["/workspace/src/lib"]);
    let inherits = create_child(&mut as_root, child("inherits")).await;
    // GetSession shows the scope as stored.
    let shown = server
        .get(&inherits.session_id)
        .await
        .session
        .expect("session");
    assert_eq!(shown.writable_paths, ["/workspace/doc", "/workspace/src"]);
    assert_eq!(
        server.stored_scope(&inherits.session_id).await,
        ["/workspace/doc", "/workspace/src"]
    );

    // Wider, or beside it: refused as an escalation, like trust.
    for paths in [
        &["/workspace"][..],
        &["/workspace/src", "/workspace/tests"],
        &["/workspace/srcx"],
    ] {
        let status = as_root
            .create_session(scoped("wider", paths))
            .await
            .expect_err("no widening");
        assert_eq!(
            status.code(),
            Code::PermissionDenied,
            "{paths:?}: {status:?}"
        );
        assert_eq!(reason(&status), "SCOPE_ESCALATION", "{paths:?}");
        assert!(
            status
                .message()
                .contains("outside the parent's write scope")
                || status.message().contains("wider"),
            "{status:?}"
        );
    }

    // The grandchild, under the narrow child: not even back to its grandparent's.
    let mut as_child = server.act_as(&narrow.session_id).await;
    for paths in [
        &["/workspace/src"][..],
        &["/workspace/doc"],
        &["/workspace"],
    ] {
        let status = as_child
            .create_session(scoped("grandchild", paths))
            .await
            .expect_err("a grandchild cannot widen");
        assert_eq!(reason(&status), "SCOPE_ESCALATION", "{paths:?}: {status:?}");
    }
    let grandchild = create_child(&mut as_child, scoped("deeper", &["/workspace/src/lib/a"])).await;
    assert_eq!(
        server.stored_scope(&grandchild.session_id).await,
        ["/workspace/src/lib/a"]
    );
    let inherited = create_child(&mut as_child, child("inherits too")).await;
    assert_eq!(
        server.stored_scope(&inherited.session_id).await,
        ["/workspace/src/lib"]
    );

    // An operator acting for the child meets the child's scope.
    let status = server
        .operator()
        .await
        .create_session(pb::CreateSessionRequest {
            parent_session_id: narrow.session_id.clone(),
            ..scoped("on behalf", &["/workspace"])
        })
        .await
        .expect_err("no widening on a session's behalf");
    assert_eq!(reason(&status), "SCOPE_ESCALATION");

    // Both the grants and the refusals are audited, with the scope.
    let audit = troupe_tests::audit_log(&server, 10_000).await;
    assert!(
        audit.iter().any(|e| e.action == "create_session"
            && e.allowed
            && e.detail.contains(&grandchild.session_id)
            && e.detail.contains("writable /workspace/src/lib/a")),
        "{audit:#?}"
    );
    assert!(
        audit
            .iter()
            .any(|e| !e.allowed && e.reason == "SCOPE_ESCALATION" && e.target == narrow.session_id),
        "{audit:#?}"
    );
    server.stop().await;
}

async fn unscoped_parents_allow_any_scope_and_bad_paths_are_invalid(backend: Backend) {
    let server = TestServer::start_on(backend, |_| {}).await;
    let root = root_of(&server, TrustLevel::Direct, &[])
        .await
        .expect("an unscoped root");
    assert!(server.stored_scope(&root.session_id).await.is_empty());
    let mut as_root = server.act_as(&root.session_id).await;
    let unscoped = create_child(
        &mut as_root,
        pb::CreateSessionRequest {
            trust_level: TrustLevel::Direct as i32,
            ..child("anything")
        },
    )
    .await;
    assert!(server.stored_scope(&unscoped.session_id).await.is_empty());
    let whole = create_child(&mut as_root, scoped("whole", &["/workspace"])).await;
    assert_eq!(server.stored_scope(&whole.session_id).await, ["/workspace"]);

    for bad in ["/etc", "src", "/workspace/../etc", "/workspace/a\0b"] {
        let status = as_root
            .create_session(scoped("bad", &[bad]))
            .await
            .expect_err("a bad path");
        assert_eq!(status.code(), Code::InvalidArgument, "{bad:?}: {status:?}");
        assert!(status.message().contains("writable path"), "{status:?}");
        let status = root_scoped(&server, &[bad])
            .await
            .expect_err("a bad root path");
        assert_eq!(status.code(), Code::InvalidArgument, "{bad:?}: {status:?}");
    }
    server.stop().await;
}

/// A sandboxed session given no scope writes only in the sandboxed area,
/// whoever made it, and its children cannot leave it; a direct parent that
/// names a scope (the whole workspace included) gives exactly that.
async fn sandboxed_sessions_given_no_scope_write_in_the_sandboxed_area(backend: Backend) {
    let server = TestServer::start_on(backend, |_| {}).await;
    let area = [troupe_proto::scope::SANDBOXED_AREA];
    let root = root_of(&server, TrustLevel::Sandboxed, &[])
        .await
        .expect("a sandboxed root");
    assert_eq!(server.stored_scope(&root.session_id).await, area);
    assert_eq!(root.writable_paths, area);
    let mut as_root = server.act_as(&root.session_id).await;
    let kid = create_child(&mut as_root, child("inherits")).await;
    assert_eq!(server.stored_scope(&kid.session_id).await, area);
    let status = as_root
        .create_session(scoped("out", &["/workspace/src"]))
        .await
        .expect_err("out of the area");
    assert_eq!(reason(&status), "SCOPE_ESCALATION", "{status:?}");

    // A direct parent's sandboxed child: the area, unless named otherwise.
    let direct = root_of(&server, TrustLevel::Direct, &[])
        .await
        .expect("a direct root");
    let mut as_direct = server.act_as(&direct.session_id).await;
    let sandboxed = |title: &str, paths: &[&str]| pb::CreateSessionRequest {
        trust_level: TrustLevel::Sandboxed as i32,
        ..scoped(title, paths)
    };
    let kid = create_child(&mut as_direct, sandboxed("default", &[])).await;
    assert_eq!(server.stored_scope(&kid.session_id).await, area);
    let named = create_child(&mut as_direct, sandboxed("named", &["/workspace"])).await;
    assert_eq!(server.stored_scope(&named.session_id).await, ["/workspace"]);

    // A scoped direct parent whose scope lacks the area names one.
    let scoped_direct = root_of(&server, TrustLevel::Direct, &["/workspace/src"])
        .await
        .expect("a scoped direct root");
    let mut as_scoped = server.act_as(&scoped_direct.session_id).await;
    let status = as_scoped
        .create_session(sandboxed("no scope", &[]))
        .await
        .expect_err("the area is outside the parent's scope");
    assert_eq!(reason(&status), "SCOPE_ESCALATION", "{status:?}");
    assert!(status.message().contains("give it a scope"), "{status:?}");
    let kid = create_child(&mut as_scoped, sandboxed("in src", &["/workspace/src/x"])).await;
    assert_eq!(
        server.stored_scope(&kid.session_id).await,
        ["/workspace/src/x"]
    );
    server.stop().await;
}

#[tokio::test]
async fn sqlite_sandboxed_sessions_given_no_scope_write_in_the_sandboxed_area() {
    sandboxed_sessions_given_no_scope_write_in_the_sandboxed_area(Backend::Sqlite).await;
}

#[tokio::test]
async fn postgres_sandboxed_sessions_given_no_scope_write_in_the_sandboxed_area() {
    sandboxed_sessions_given_no_scope_write_in_the_sandboxed_area(Backend::Postgres).await;
}

#[tokio::test]
async fn sqlite_a_grandchild_cannot_widen_its_scope() {
    a_grandchild_cannot_widen_its_scope(Backend::Sqlite).await;
}

#[tokio::test]
async fn postgres_a_grandchild_cannot_widen_its_scope() {
    a_grandchild_cannot_widen_its_scope(Backend::Postgres).await;
}

#[tokio::test]
async fn sqlite_unscoped_parents_allow_any_scope_and_bad_paths_are_invalid() {
    unscoped_parents_allow_any_scope_and_bad_paths_are_invalid(Backend::Sqlite).await;
}

#[tokio::test]
async fn postgres_unscoped_parents_allow_any_scope_and_bad_paths_are_invalid() {
    unscoped_parents_allow_any_scope_and_bad_paths_are_invalid(Backend::Postgres).await;
}
