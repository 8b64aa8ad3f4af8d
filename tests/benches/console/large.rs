//! The console's first paint of a large workspace: `BENCH_LARGE_SESSIONS`
//! sessions (default 10,000: trees of a root and 99 children) made straight
//! in a new SQLite database (`troupe_tests::console::seed_trees`), then
//! the service started on it; on a fresh page of the workspace's tree
//! route, signed in, the page times from the submit to the first row in
//! the DOM (the first page of the snapshot drawn), to every row, and to
//! the end of the next frame after it.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use troupe_session_svc::store::SqliteStore;
use troupe_tests::{browser::Browser, process::SessionProcess};

use super::{FLAGS, open, sign_out, stats};
use troupe_tests::ports::free_addr;

/// Sessions a tree holds in the large workspace.
const TREE: usize = 100;

/// Records, in the page, the submit of the sign-in form, the first row in
/// the tree, and the moment `rows` rows are; then the end of the next frame.
const PROBE: &str = "
const rows = arguments[0];
const r = window.__render = {};
document.addEventListener('submit', () => { r.submit = performance.now(); }, true);
const mo = new MutationObserver(() => {
  if (r.submit === undefined || r.rows !== undefined) return;
  const n = document.querySelectorAll('#tree .node-row').length;
  if (n > 0 && r.first === undefined) r.first = performance.now();
  if (n < rows) return;
  r.rows = performance.now();
  mo.disconnect();
  requestAnimationFrame(() => setTimeout(() => { r.frame = performance.now(); }, 0));
});
mo.observe(document.getElementById('main'), { childList: true, subtree: true });
";

/// How long the page may take to show every row (a browser's wait is a
/// minute: a large workspace may take longer).
const EVERY_ROW_WAIT: Duration = Duration::from_secs(600);

/// Waits for the probe's record of every row and the next frame.
async fn every_row(browser: &Browser) -> anyhow::Result<serde_json::Value> {
    let deadline = Instant::now() + EVERY_ROW_WAIT;
    loop {
        let r = browser
            .js("return window.__render.frame !== undefined && window.__render")
            .await?;
        if r.is_object() {
            return Ok(r);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "every row not shown within {EVERY_ROW_WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Seeds the workspace, starts `binary` on it with its console, and
/// prints `runs` runs' times.
pub async fn bench(
    binary: &str,
    browser: &Browser,
    sessions: usize,
    runs: usize,
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("workspaces/Agents"))?;
    std::fs::create_dir_all(dir.path().join("data"))?;
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("data/troupe.db").display()
    );
    let seeding = Instant::now();
    let trees = sessions.div_ceil(TREE);
    {
        let store = SqliteStore::open(&url).await?;
        troupe_tests::console::seed_trees(&store, trees, TREE - 1).await;
    }
    let rows = trees * TREE;
    println!(
        "seeded {rows} sessions ({trees} trees of {TREE}) in the store in {:.1} s",
        seeding.elapsed().as_secs_f64()
    );
    let console: SocketAddr = free_addr();
    let listen = console.to_string();
    let mut flags: Vec<&str> = FLAGS.to_vec();
    flags.extend(["--console-listen", &listen]);
    let service = SessionProcess::start_in(binary, dir, &flags, &[]);
    service.channel().await;
    troupe_tests::http::wait_listening(console).await;
    let url = format!("http://{console}/#/w/alpha");

    println!("\n## First paint of a workspace of {rows} sessions\n");
    println!(
        "| run | submit to the first row (ms) | to every row (ms) | to the next frame's end (ms) |"
    );
    println!("|---|---|---|---|");
    let (mut first, mut every, mut frame) = (Vec::new(), Vec::new(), Vec::new());
    for run in 1..=runs {
        open(browser, &url).await?;
        browser.wait_for("#token").await?;
        browser.client.execute(PROBE, vec![rows.into()]).await?;
        browser
            .type_into("#token", troupe_tests::OPERATOR_TOKEN)
            .await?;
        browser.click("#sign-in").await?;
        let r = every_row(browser).await?;
        let at =
            |k: &str| r[k].as_f64().unwrap_or(f64::NAN) - r["submit"].as_f64().unwrap_or(f64::NAN);
        println!(
            "| {run} | {:.1} | {:.1} | {:.1} |",
            at("first"),
            at("rows"),
            at("frame")
        );
        first.push(at("first"));
        every.push(at("rows"));
        frame.push(at("frame"));
        sign_out(browser).await?;
    }
    println!(
        "\nfirst row: {}\nevery row: {}\nframe: {}",
        stats(first),
        stats(every),
        stats(frame)
    );
    anyhow::ensure!(service.stop().await, "the service did not stop cleanly");
    Ok(())
}
