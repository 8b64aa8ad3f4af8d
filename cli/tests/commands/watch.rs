//! A watch outlives a restart of the service.

use super::*;

/// A watch outlives a restart of the service: it opens again after the last
/// cursor it printed, and sees what happened meanwhile once, in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_watch_resumes_across_a_restart_of_the_service() {
    let mut server = TestServer::start().await;
    let data = tempfile::tempdir().expect("dir");
    let (root, mut as_root, _) = server.root("alpha", TrustLevel::Direct).await;
    let mut watch = troupe(&server, data.path())
        .args(["session", "watch", "--tree", &root.tree_id])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("watch runs");
    let mut lines = JsonLines::read(watch.stdout.take().expect("stdout"));
    let created = lines.next().await;
    assert_eq!(created["kind"], "created");

    server.restart().await;
    // Made while the watch reconnects, or after: it sees them either way.
    let kid = create_child(&mut as_root, child("after the restart")).await;
    let mut seen = vec![created];
    while !seen
        .iter()
        .any(|e| e["session_id"] == kid.session_id.as_str())
    {
        seen.push(lines.next().await);
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let cursors: Vec<i64> = seen
        .iter()
        .filter_map(|e| e["cursor"].as_str())
        .map(|c| troupe_tests::position(c, "alpha"))
        .collect();
    assert!(
        cursors.windows(2).all(|w| w[0] < w[1]),
        "in order, none twice: {cursors:?}"
    );
    server.stop().await;
}
