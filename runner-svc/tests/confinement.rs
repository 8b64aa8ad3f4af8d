//! What a workspace container lets its agents share: `/workspace`, by
//! design (a sandboxed agent given no scope writes only its sandboxed
//! area), and nothing else; and containers made otherwise (by an older
//! runner, or other flags) are made again once nothing runs in them.

use crate::common;

use std::{collections::BTreeSet, time::Duration};

use common::{pair::*, *};
use troupe_proto::{
    runner::TerminateExecRequest,
    session::{CreateSessionRequest, SessionStatus, TrustLevel},
};
use troupe_runner_svc::docker::{Engine, SPEC_LABEL};

/// Prints every place the agent can write (`W <path>`), by writing there:
/// a new file in every directory, an append of nothing to every file (and
/// for FIFOs and sockets, the permission); `/proc` is per process and
/// `/sys` read-only. Then which of the usual scratch places take a file
/// (`WROTE <dir>`); then it writes a file in `$TMPDIR` and tries to read
/// and list the other agent's `$TMPDIR`, named by its first stdin line.
/// (busybox's `test -w` reads the mode alone, so it cannot tell.)
const SCANNER: &str = r#"
read -r line
other=$(printf '%s' "$line" | sed -n 's/.*"message":"\([^"]*\)".*/\1/p')
every() { find / \( -path /proc -o -path /sys \) -prune -o "$@" -print 2>/dev/null; }
every -type d | while read -r p; do
  if true 2>/dev/null >"$p/.w.$$"; then rm -f "$p/.w.$$"; echo "W $p"; fi
done
every -type f | while read -r p; do
  if true 2>/dev/null >>"$p"; then echo "W $p"; fi
done
every \( -type p -o -type s \) | while read -r p; do [ -w "$p" ] && echo "W $p"; done
for d in / /tmp /var/tmp /dev/shm /dev/mqueue /dev /run /run/troupe /var /etc /home /root /opt /sys/fs/cgroup; do
  if true 2>/dev/null >"$d/probe.$$"; then echo "WROTE $d"; fi
done
echo "mine $TROUPE_SESSION_ID" > "$TMPDIR/mine" && echo "TMPDIR $TMPDIR $(cat "$TMPDIR/mine")"
if [ "$other" != none ]; then
  cat "$other/mine" 2>/dev/null && echo "READ OTHER"
  ls "$other" 2>/dev/null && echo "LISTED OTHER"
fi
echo scanned
read -r _
"#;

/// What one scanner reported, once it has.
struct Scan {
    writable: BTreeSet<String>,
    lines: Vec<String>,
}

async fn scan_of(pair: &Pair, id: &str) -> Scan {
    let deadline = tokio::time::Instant::now() + MINUTE;
    let tail = loop {
        let got = pair.get(id).await;
        let tail = got.result.map(|r| r.output_tail).unwrap_or_default();
        if tail.contains("scanned\n") {
            break tail;
        }
        assert!(tokio::time::Instant::now() < deadline, "{id}: {tail}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    Scan {
        writable: tail
            .lines()
            .filter_map(|l| l.strip_prefix("W "))
            .map(str::to_owned)
            .collect(),
        lines: tail.lines().map(str::to_owned).collect(),
    }
}

/// Two agents of one workspace, a direct one and a sandboxed one, each
/// find every place they may write: besides `/workspace` (shared by design)
/// and the session service's socket, only their own exec directory, where
/// `$HOME` and `$TMPDIR` are. `/tmp` and the other scratch places take no
/// file, and neither agent can read or list the other's `$TMPDIR`.
#[tokio::test]
async fn agents_share_the_workspace_and_nothing_else() {
    let pair = Pair::start().await;
    let ws = pair.runner.workspace("shared");
    pair.agent(&ws, "scanner", SCANNER);
    let direct = pair.root(&ws, "scanner", "none").await.session_id;
    let first = scan_of(&pair, &direct).await;
    let direct_tmp = format!("/run/troupe/execs/{direct}/tmp");
    let sandboxed = pair
        .server
        .operator()
        .await
        .create_session(CreateSessionRequest {
            title: "sandboxed scanner".into(),
            agent_name: "scanner".into(),
            initial_message: direct_tmp.clone(),
            parent_session_id: direct.clone(),
            trust_level: TrustLevel::Sandboxed as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap()
        .session_id;
    let second = scan_of(&pair, &sandboxed).await;

    let mut wrote_where = Vec::new();
    for (id, scan) in [(&direct, &first), (&sandboxed, &second)] {
        let own = format!("/run/troupe/execs/{id}");
        let elsewhere: Vec<&String> = scan
            .writable
            .iter()
            .filter(|p| {
                !(p.as_str() == "/workspace"
                    || p.starts_with("/workspace/")
                    || p.as_str() == "/run/troupe/session/session.sock"
                    || p.as_str() == own
                    || p.starts_with(&format!("{own}/")))
            })
            .collect();
        assert!(elsewhere.is_empty(), "{id} may write {elsewhere:?}");
        wrote_where.push(scan.writable.clone());
        let wrote: Vec<&String> = scan
            .lines
            .iter()
            .filter(|l| l.starts_with("WROTE "))
            .collect();
        assert!(wrote.is_empty(), "{id}: {wrote:?}");
        let tmp = format!("TMPDIR {own}/tmp mine {id}");
        assert!(scan.lines.contains(&tmp), "{id}: {:?}", scan.lines);
    }
    // The direct agent writes the whole workspace; the sandboxed one, given
    // no scope, only its sandboxed area.
    assert!(
        wrote_where[0].contains("/workspace"),
        "{:?}",
        wrote_where[0]
    );
    assert!(
        wrote_where[1].contains("/workspace/sandboxed"),
        "{:?}",
        wrote_where[1]
    );
    let outside: Vec<&String> = wrote_where[1]
        .iter()
        .filter(|p| p.as_str() == "/workspace" || p.starts_with("/workspace/"))
        .filter(|p| {
            !(p.as_str() == "/workspace/sandboxed" || p.starts_with("/workspace/sandboxed/"))
        })
        .collect();
    assert!(
        outside.is_empty(),
        "the sandboxed agent may write {outside:?}"
    );
    let shared: Vec<&String> = first
        .writable
        .intersection(&second.writable)
        .filter(|p| !(p.as_str() == "/workspace" || p.starts_with("/workspace/")))
        .filter(|p| p.as_str() != "/run/troupe/session/session.sock")
        .collect();
    assert!(shared.is_empty(), "both may write {shared:?}");
    assert!(
        !second
            .lines
            .iter()
            .any(|l| l.contains("OTHER") || l.contains(&format!("mine {direct}"))),
        "{:?}",
        second.lines
    );
    pair.server
        .operator()
        .await
        .terminate_session(troupe_proto::session::TerminateSessionRequest {
            session_id: direct.clone(),
            reason: String::new(),
        })
        .await
        .unwrap();
    pair.wait_status(&sandboxed, SessionStatus::Terminated)
        .await;
}

/// A workspace container made otherwise (here, with another process limit;
/// an older runner's has no spec label at all) is kept while execs that
/// run in it live, so they are not cut short, and made again, as this
/// runner makes them, by the first start that finds it idle.
#[tokio::test]
async fn a_container_made_otherwise_is_made_again_once_idle() {
    let mut runner = TestRunner::start_with(|c| c.pids_limit = 900).await;
    let ws = runner.workspace("remade");
    runner.sh(&ws, "old", "sleep 1005").await;
    let docker = docker().await;
    let name = Engine::container_name(&ws);
    let before = docker.inspect_container(&name, None).await.unwrap();
    assert_eq!(before.host_config.unwrap().pids_limit, Some(900));

    runner.stop().await;
    runner.config.pids_limit = 1000;
    runner.start_again().await;
    // The old exec still runs in it: a new start joins it there.
    let out = run_sh(&runner, &ws, "beside", "echo beside").await;
    assert_eq!(out.stdout_text(), "beside\n");
    let kept = docker.inspect_container(&name, None).await.unwrap();
    assert_eq!(kept.id, before.id);

    let mut client = runner.client().await;
    client
        .terminate_exec(TerminateExecRequest {
            exec_id: "old".into(),
            grace_ms: 100,
        })
        .await
        .unwrap();
    let out = run_sh(&runner, &ws, "after", "echo after").await;
    assert_eq!(out.stdout_text(), "after\n");
    let remade = docker.inspect_container(&name, None).await.unwrap();
    assert_ne!(remade.id, before.id);
    let host = remade.host_config.unwrap();
    assert_eq!(host.pids_limit, Some(1000));
    assert_eq!(host.readonly_rootfs, Some(true));
    let labels = remade.config.unwrap().labels.unwrap();
    assert!(labels.contains_key(SPEC_LABEL), "{labels:?}");
}
