//! Write scopes, enforced by the kernel: an exec given `writable_paths`
//! (and everything it starts) can write only under them, its `$HOME` and
//! `$TMPDIR`; an exec of the same workspace given none writes anywhere in
//! the workspace, as before. A scope the supervisor cannot apply as asked
//! refuses the start.

use crate::common;

use common::*;
use tonic::Code;
use troupe_proto::runner::ExitReason;

/// Every write an agent might make, each printed `OK <what>` or
/// `NO <what>: <error>`, then the state it left. Each runs in a process of
/// its own (`sh -c`, `mv`, ...): the scope holds for what the agent starts.
const PROBE: &str = r#"
t() { what=$1; shift; if err=$("$@" 2>&1); then echo "OK $what"; else echo "NO $what: $err"; fi; }
cd /workspace
t create sh -c 'echo new > out.txt'
t append sh -c 'echo more >> keep.txt'
t overwrite sh -c 'echo over > keep.txt'
t truncate truncate -s 0 keep.txt
t mkdir mkdir newdir
t rename_out mv src/in.txt moved.txt
t rename_in mv move-me.txt src/move-me.txt
t rename_within mv keep.txt kept.txt
t delete rm keep.txt
t rmdir rmdir empty
t symlink ln -s keep.txt link
t in_create sh -c 'echo new > src/new.txt'
t in_append sh -c 'echo more >> src/new.txt'
t in_truncate truncate -s 1 src/new.txt
t in_mkdir mkdir src/d
t in_rename mv src/new.txt src/d/renamed.txt
t in_delete rm src/d/renamed.txt
t in_rmdir rmdir src/d
t home sh -c 'echo h > "$HOME/h" && rm "$HOME/h"'
t tmpdir sh -c 'echo t > "$TMPDIR/t" && rm "$TMPDIR/t"'
t devnull sh -c 'echo x > /dev/null'
echo "keep=$(cat keep.txt 2>&1)"
echo probed
"#;

/// Lays out a workspace: `keep.txt`, `move-me.txt`, `empty/`, and
/// `src/in.txt`, writable by the workspace's group, as agents leave them.
fn lay_out(runner: &TestRunner, ws: &str) -> std::path::PathBuf {
    use std::os::unix::fs::{PermissionsExt, chown};
    let root = runner.config.workspaces_dir().join(ws);
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::create_dir_all(root.join("empty")).unwrap();
    std::fs::write(root.join("keep.txt"), "original\n").unwrap();
    std::fs::write(root.join("move-me.txt"), "m\n").unwrap();
    std::fs::write(root.join("src/in.txt"), "i\n").unwrap();
    let gid = runner.config.uid_base;
    for p in ["", "src", "empty", "keep.txt", "move-me.txt", "src/in.txt"] {
        let p = root.join(p);
        chown(&p, None, Some(gid)).unwrap();
        let mode = if p.is_dir() { 0o2775 } else { 0o664 };
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    root
}

fn results(text: &str) -> Vec<(&str, bool, &str)> {
    text.lines()
        .filter_map(|l| {
            let (ok, rest) = match l.split_once(' ')? {
                ("OK", rest) => (true, rest),
                ("NO", rest) => (false, rest),
                _ => return None,
            };
            let (what, err) = rest.split_once(": ").unwrap_or((rest, ""));
            Some((what, ok, err))
        })
        .collect()
}

#[tokio::test]
async fn scoped_agent_writes_only_inside_its_scope_and_an_unscoped_sibling_anywhere() {
    require_engine();
    let runner = TestRunner::start().await;
    let mut client = runner.client().await;

    let ws = runner.workspace("scope");
    let root = lay_out(&runner, &ws);
    let mut req = start_request(&ws, "scoped", &["sh", "-c", PROBE]);
    req.writable_paths = vec!["/workspace/src/".into()];
    client.start_exec(req).await.expect("start scoped");
    let out = collect(&mut client, "scoped", 0, MINUTE).await;
    let text = out.stdout_text();
    assert!(text.contains("probed"), "{text}\n{}", out.stderr_text());
    let got = results(&text);
    assert_eq!(got.len(), 21, "{text}");
    for (what, ok, err) in &got {
        let inside = what.starts_with("in_") || ["home", "tmpdir", "devnull"].contains(what);
        assert_eq!(*ok, inside, "{what}: {err}\n{text}");
        if !inside {
            // EACCES, or for a rename across the scope's edge the copy
            // `mv` falls back to, refused the same way.
            assert!(err.contains("Permission denied"), "{what}: {err}");
        }
    }
    assert!(text.contains("keep=original"), "{text}");
    assert!(!root.join("out.txt").exists() && !root.join("moved.txt").exists());
    assert!(root.join("src/in.txt").exists() && root.join("move-me.txt").exists());
    assert!(root.join("empty").is_dir() && !root.join("newdir").exists());

    // A sibling in the same workspace, given no scope, writes anywhere in it.
    lay_out(&runner, &ws);
    let out = run_sh(&runner, &ws, "sibling", PROBE).await;
    let text = out.stdout_text();
    let got = results(&text);
    assert_eq!(got.len(), 21, "{text}");
    for (what, ok, err) in &got {
        // Its `keep.txt` is gone by the time it would be renamed or removed.
        let gone = ["delete"].contains(what);
        assert!(*ok || gone, "{what}: {err}\n{text}");
    }
}

#[tokio::test]
async fn a_scope_through_a_symlink_or_missing_refuses_the_start() {
    require_engine();
    let runner = TestRunner::start().await;
    let mut client = runner.client().await;
    let ws = runner.workspace("scope-link");
    let root = lay_out(&runner, &ws);
    std::os::unix::fs::symlink("/workspace/empty", root.join("src/link")).unwrap();

    for (id, path, why) in [
        ("linked", "/workspace/src/link", "symbolic link"),
        ("missing", "/workspace/nowhere", "no such directory"),
        ("a-file", "/workspace/keep.txt", "not a directory"),
    ] {
        let mut req = start_request(&ws, id, &["sh", "-c", "echo ran > /workspace/empty/ran"]);
        req.writable_paths = vec![path.into()];
        client.start_exec(req).await.expect("start");
        let out = collect(&mut client, id, 0, MINUTE).await;
        let (code, reason, detail) = out.exit.expect("an exit");
        assert_eq!((code, reason), (126, ExitReason::Exited), "{id}: {detail}");
        assert!(
            detail.contains(why) && detail.contains(path),
            "{id}: {detail}"
        );
        assert!(!root.join("empty/ran").exists(), "{id} ran");
    }
}

#[tokio::test]
async fn writable_paths_outside_the_workspace_are_invalid() {
    let runner = TestRunner::start().await;
    let mut client = runner.client().await;
    let ws = runner.workspace("scope-bad");
    for bad in ["/etc", "workspace/src", "/workspace/../etc", "/workspacex"] {
        let mut req = start_request(&ws, "bad", &["true"]);
        req.writable_paths = vec![bad.into()];
        let err = client.start_exec(req).await.expect_err(bad);
        assert_eq!(err.code(), Code::InvalidArgument, "{bad}: {err:?}");
        assert!(err.message().contains("writable path"), "{bad}: {err:?}");
    }
}

/// End to end: a root the operator scoped to `/workspace/src`, and its
/// child that asked for no scope (it inherits it), can write only there;
/// an unscoped root of the same workspace writes anywhere in it.
#[tokio::test]
async fn a_sessions_scope_reaches_its_agent_and_its_childrens() {
    require_engine();
    let pair = common::pair::Pair::start().await;
    let ws = pair.runner.workspace("scope-e2e");
    let root_dir = lay_out(&pair.runner, &ws);
    pair.agent(
        &ws,
        "writer",
        r#"read -r _; id=$TROUPE_SESSION_ID
        echo in > /workspace/src/$id && echo "in:ok"
        if echo out 2>/dev/null > /workspace/$id; then echo "out:ok"; else echo "out:denied"; fi"#,
    );
    let create_root = |paths: &[&str]| troupe_proto::session::CreateRootSessionRequest {
        workspace_id: ws.clone(),
        agent_name: "writer".into(),
        initial_message: "go".into(),
        writable_paths: paths.iter().map(|p| (*p).to_owned()).collect(),
        ..Default::default()
    };
    let mut op = pair.server.operator().await;
    let scoped = op
        .create_root_session(create_root(&["/workspace/src"]))
        .await
        .expect("scoped root")
        .into_inner()
        .session
        .unwrap();
    // Abandoned when the root ends: the root's agent exits once it has
    // written, maybe before its child has.
    let child = op
        .create_session(troupe_proto::session::CreateSessionRequest {
            title: "writer".into(),
            agent_name: "writer".into(),
            initial_message: "go".into(),
            parent_session_id: scoped.session_id.clone(),
            on_parent_end: troupe_proto::session::ParentEndPolicy::Abandon as i32,
            ..Default::default()
        })
        .await
        .expect("child")
        .into_inner()
        .session
        .unwrap();
    // Direct: a sandboxed root given no scope writes only its area.
    let unscoped = op
        .create_root_session(troupe_proto::session::CreateRootSessionRequest {
            trust_level: troupe_proto::session::TrustLevel::Direct as i32,
            ..create_root(&[])
        })
        .await
        .expect("unscoped root")
        .into_inner()
        .session
        .unwrap();

    for (id, outside) in [
        (&scoped.session_id, "out:denied"),
        (&child.session_id, "out:denied"),
        (&unscoped.session_id, "out:ok"),
    ] {
        let got = pair
            .wait_status(id, troupe_proto::session::SessionStatus::Completed)
            .await;
        let tail = got.result.map(|r| r.output_tail).unwrap_or_default();
        assert!(
            tail.contains("in:ok") && tail.contains(outside),
            "{id}: {tail}"
        );
        assert!(root_dir.join("src").join(id).exists(), "{id}");
        assert_eq!(root_dir.join(id).exists(), outside == "out:ok", "{id}");
    }
}
