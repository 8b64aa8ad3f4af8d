//! The web console against a workspace of 1,000 sessions, in a real browser
//! (headless Chromium through chromedriver, `troupe_tests::browser`) and
//! the real release `troupe-session` binary as a child process (SQLite, no
//! runner: sessions stay pending), so the service's CPU time and resident
//! memory are read from `/proc` apart from the bench's and the browser's.
//!
//! 1. **Seeding**: `TREES` spawn trees of 100 sessions each (depths 0 to 3),
//!    every child created over gRPC by its parent with the parent's own
//!    token (the operator only creates the roots and issues each child's
//!    token, as the runner would hand it to the agent).
//! 2. **Render after sign-in** (`BENCH_RENDER_RUNS`, default 5): a fresh
//!    page on the workspace's tree route, the token typed, the form
//!    submitted; the page itself times (`performance.now()`) from the
//!    submit event to the moment all 1,000 rows are in the DOM (a
//!    MutationObserver), and to the end of the next frame after it. Signed
//!    out between runs.
//! 3. **Event to DOM**: the page shows the tree while a background of
//!    `BENCH_BUSY_PER_SEC` events per second (default 100: four progress
//!    reports to one message, from sessions round the tree) runs; `BENCH_MARKS`
//!    (default 300) marked progress reports (`mark-N`, 10 a second, from 20
//!    other sessions in turn) are timed from the wall clock just before each
//!    call to the moment a MutationObserver in the page sees the mark in the
//!    DOM (`performance.timeOrigin + performance.now()`, the same machine's
//!    clock).
//! 4. **Cost**: the service's CPU (utime + stime, as % of one core) over
//!    `BENCH_COST_SECS` (default 15) and its RSS, on the same data after a
//!    restart: console off at rest and busy; console on at rest, busy with no
//!    page, and busy with 10 pages (a headless Chromium each) watching.
//!
//! 5. **A large workspace** (`console/large.rs`), first: the first paint of
//!    a workspace of `BENCH_LARGE_SESSIONS` sessions (default 10,000; 0
//!    leaves it out) made in the store, `BENCH_RENDER_RUNS` times;
//!    `BENCH_LARGE_ONLY=1` stops the bench after it.
//!
//! Run: `cargo build --release -p troupe-session-svc && cargo bench -p troupe-tests --bench console`
//! (`BENCH_SESSION_BIN` names another `troupe-session` to run instead).

#[path = "console/large.rs"]
mod large;

use std::{
    collections::HashMap,
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, ensure};
use troupe_proto::session::{self as pb, TrustLevel, session_service_client::SessionServiceClient};
use troupe_tests::{
    Client, OPERATOR_TOKEN,
    bench::percentile,
    browser::Browser,
    child,
    ports::free_addr,
    process::{SessionProcess, Stopped},
};

const WORKSPACE: &str = "bench";
/// Spawn trees in the workspace, of `1 + 3 + 3*4 + 3*4*7 = 100` sessions each.
const TREES: usize = 10;
/// Children of each session at depth 0, 1, 2.
const FAN_OUT: [usize; 3] = [3, 4, 7];
/// Sessions that report the marks, in turn (so each mark stays on the page
/// for a while before the same session's next one replaces it).
const MARKERS: usize = 20;
const MARK_EVERY: Duration = Duration::from_millis(100);
/// Windows watching the busy tree in the last cost window.
const PAGES: usize = 10;

/// Limits out of the way, and no start deadline: with no runner every
/// session stays pending.
const FLAGS: [&str; 16] = [
    "--max-depth",
    "3",
    "--max-tree-sessions",
    "1000000",
    "--max-children",
    "1000000",
    "--max-active-per-workspace",
    "1000000",
    "--spawn-rate-per-sec",
    "0",
    "--message-rate-per-sec",
    "0",
    "--start-deadline-secs",
    "86400",
    "--console-session-ttl-secs",
    "86400",
];

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The release `troupe-session` beside this bench's binary, or the one
/// `BENCH_SESSION_BIN` names (to compare two builds).
fn binary() -> String {
    if let Ok(path) = std::env::var("BENCH_SESSION_BIN") {
        return path;
    }
    let exe = std::env::current_exe().expect("the bench's path");
    let path: PathBuf = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/release/deps")
        .join("troupe-session");
    assert!(
        path.exists(),
        "build the service first: cargo build --release -p troupe-session-svc ({})",
        path.display()
    );
    path.display().to_string()
}

/// Milliseconds since the Unix epoch, with the fraction.
fn wall_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
        * 1000.0
}

/// The seeded sessions: ids, tokens and shape.
struct Tree {
    ids: Vec<String>,
    tokens: Vec<String>,
    parent: Vec<Option<usize>>,
    first_child: Vec<Option<usize>>,
}

impl Tree {
    fn len(&self) -> usize {
        self.ids.len()
    }

    /// A client per session, each with its own token, on one connection.
    async fn clients(&self, service: &SessionProcess) -> Vec<Client> {
        let channel = service.channel().await;
        self.tokens
            .iter()
            .map(|token| {
                let auth = troupe_proto::endpoint::Bearer::new(Some(token)).expect("ascii token");
                SessionServiceClient::with_interceptor(channel.clone(), auth)
            })
            .collect()
    }

    /// The sessions that report the marks: spread over the trees.
    fn markers(&self) -> Vec<usize> {
        (0..MARKERS).map(|i| i * self.len() / MARKERS + 1).collect()
    }
}

async fn seed(service: &SessionProcess) -> Tree {
    let mut op = service.operator().await;
    let channel = service.channel().await;
    let mut tree = Tree {
        ids: Vec::new(),
        tokens: Vec::new(),
        parent: Vec::new(),
        first_child: Vec::new(),
    };
    for t in 0..TREES {
        let root = op
            .create_root_session(pb::CreateRootSessionRequest {
                workspace_id: WORKSPACE.into(),
                trust_level: TrustLevel::Direct as i32,
                agent_name: "worker".into(),
                title: format!("tree {t}"),
                ..Default::default()
            })
            .await
            .expect("root")
            .into_inner();
        tree.ids.push(root.session.expect("a session").session_id);
        tree.tokens.push(root.session_token);
        tree.parent.push(None);
        tree.first_child.push(None);
        let mut level = vec![tree.len() - 1];
        for fan_out in FAN_OUT {
            let mut next = Vec::new();
            for &parent in &level {
                let auth = troupe_proto::endpoint::Bearer::new(Some(&tree.tokens[parent])).unwrap();
                let mut as_parent = SessionServiceClient::with_interceptor(channel.clone(), auth);
                for c in 0..fan_out {
                    let created = as_parent
                        .create_session(child(&format!("task {c} of {}", tree.ids[parent])))
                        .await
                        .expect("child")
                        .into_inner();
                    let id = created.session.expect("a session").session_id;
                    let token = op
                        .issue_session_token(pb::IssueSessionTokenRequest {
                            session_id: id.clone(),
                        })
                        .await
                        .expect("token")
                        .into_inner()
                        .session_token;
                    let index = tree.len();
                    tree.first_child[parent].get_or_insert(index);
                    tree.ids.push(id);
                    tree.tokens.push(token);
                    tree.parent.push(Some(parent));
                    tree.first_child.push(None);
                    next.push(index);
                }
            }
            level = next;
        }
    }
    tree
}

/// A steady background of events from the sessions that do not mark:
/// `per_sec` a second, four progress reports to one message (to the
/// session's first child, or to its parent if it has none).
struct Busy {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
    started: Instant,
}

impl Busy {
    fn start(tree: &Tree, mut clients: Vec<Client>, per_sec: usize) -> Busy {
        let markers = tree.markers();
        let busy: Vec<usize> = (0..tree.len()).filter(|i| !markers.contains(i)).collect();
        let to: Vec<String> = (0..tree.len())
            .map(|i| {
                let other = tree.first_child[i].or(tree.parent[i]).expect("a neighbour");
                tree.ids[other].clone()
            })
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let (stopping, counting) = (stop.clone(), done.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_sec as f64));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut k = 0usize;
            while !stopping.load(Ordering::Relaxed) {
                tick.tick().await;
                let i = busy[k % busy.len()];
                let client = &mut clients[i];
                if k % 5 == 4 {
                    client
                        .send_message(troupe_tests::message(&to[i], format!("busy {k}")))
                        .await
                        .expect("busy message");
                } else {
                    client
                        .report_progress(pb::ReportProgressRequest {
                            progress: (k % 100) as u32,
                            description: format!("busy {k}"),
                        })
                        .await
                        .expect("busy progress");
                }
                counting.fetch_add(1, Ordering::Relaxed);
                k += 1;
            }
        });
        Busy {
            stop,
            done,
            task,
            started: Instant::now(),
        }
    }

    /// Stops; returns the rate achieved, events a second.
    async fn stop(self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("busy task");
        self.done.load(Ordering::Relaxed) as f64 / self.started.elapsed().as_secs_f64()
    }
}

/// Records, in the page, the submit of the sign-in form and the moment
/// `rows` rows are in the tree; then the end of the next frame.
const RENDER_PROBE: &str = "
const rows = arguments[0];
const r = window.__render = {};
document.addEventListener('submit', () => { r.submit = performance.now(); }, true);
const mo = new MutationObserver(() => {
  if (r.submit === undefined || r.rows !== undefined) return;
  if (document.querySelectorAll('#tree .node-row').length < rows) return;
  r.rows = performance.now();
  mo.disconnect();
  requestAnimationFrame(() => setTimeout(() => { r.frame = performance.now(); }, 0));
});
mo.observe(document.getElementById('main'), { childList: true, subtree: true });
";

/// Records, in the page, the first moment each mark (`mark-N`) is in the
/// tree: only what each mutation added or changed is searched.
const MARK_PROBE: &str = "
const seen = window.__marks = {};
const found = (text, at) => {
  const m = /mark-(\\d+)/.exec(text || '');
  if (m && !(m[1] in seen)) seen[m[1]] = at;
};
const mo = new MutationObserver((records) => {
  const at = performance.timeOrigin + performance.now();
  for (const record of records) {
    if (record.type === 'characterData') found(record.target.data, at);
    for (const node of record.addedNodes) {
      if (node.nodeType === Node.TEXT_NODE) found(node.data, at);
      else if (node.nodeType === Node.ELEMENT_NODE) {
        if (node.matches('.progress')) found(node.textContent, at);
        for (const p of node.querySelectorAll('.progress')) found(p.textContent, at);
      }
    }
  }
});
mo.observe(document.getElementById('tree'), { childList: true, subtree: true, characterData: true });
";

/// Runs the measurement in the page `script`, with `args`.
async fn js(
    browser: &Browser,
    script: &str,
    args: Vec<serde_json::Value>,
) -> anyhow::Result<serde_json::Value> {
    browser
        .client
        .execute(script, args)
        .await
        .context("script failed")
}

/// Signs in on a fresh page of the tree route; returns the ms from submit
/// to all rows in the DOM, and to the next frame's end.
async fn render_once(browser: &Browser, url: &str, rows: usize) -> anyhow::Result<(f64, f64)> {
    open(browser, url).await?;
    browser.wait_for("#token").await?;
    js(browser, RENDER_PROBE, vec![rows.into()]).await?;
    browser.type_into("#token", OPERATOR_TOKEN).await?;
    browser.click("#sign-in").await?;
    let r = browser
        .until(
            "every row",
            "return window.__render.frame !== undefined && window.__render",
        )
        .await?;
    let at = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    Ok((at("rows") - at("submit"), at("frame") - at("submit")))
}

async fn sign_out(browser: &Browser) -> anyhow::Result<()> {
    browser.click("#sign-out").await?;
    browser.wait_for("#token").await?;
    Ok(())
}

/// Opens `url` on a fresh page. The page itself navigates, not WebDriver:
/// chromedriver's wait for the load (`goto`) failed at times on this page
/// ("Timed out receiving message from renderer"); the caller waits for
/// what it needs instead.
async fn open(browser: &Browser, url: &str) -> anyhow::Result<()> {
    browser.goto("about:blank").await?;
    js(browser, "location.href = arguments[0]", vec![url.into()]).await?;
    Ok(())
}

/// Signs in on a fresh page of the tree route and waits for every row.
async fn show_tree(browser: &Browser, url: &str, rows: usize) -> anyhow::Result<()> {
    open(browser, url).await?;
    browser.type_into("#token", OPERATOR_TOKEN).await?;
    browser.click("#sign-in").await?;
    browser
        .until(
            "every row",
            &format!("return document.querySelectorAll('#tree .node-row').length >= {rows}"),
        )
        .await?;
    Ok(())
}

fn stats(mut values: Vec<f64>) -> String {
    if values.is_empty() {
        return "none".into();
    }
    values.sort_by(f64::total_cmp);
    format!(
        "p50 {:.1} / p99 {:.1} / max {:.1} (n = {})",
        percentile(&values, 50.0),
        percentile(&values, 99.0),
        values[values.len() - 1],
        values.len()
    )
}

/// The service's CPU (% of one core) and RSS (MiB) over `window`.
async fn cost(service: &SessionProcess, window: Duration) -> (f64, f64) {
    let start = service.cpu_time();
    let began = Instant::now();
    tokio::time::sleep(window).await;
    let used = service.cpu_time() - start;
    let cpu = used.as_secs_f64() / began.elapsed().as_secs_f64() * 100.0;
    (cpu, service.rss_kib() as f64 / 1024.0)
}

fn start(stopped: Stopped, console: Option<SocketAddr>) -> SessionProcess {
    let listen = console.map(|a| a.to_string());
    let mut flags: Vec<&str> = FLAGS.to_vec();
    if let Some(listen) = &listen {
        flags.extend(["--console-listen", listen]);
    }
    stopped.start(&flags, &[])
}

/// The whole run at most: a browser command that never answers fails the
/// bench instead of hanging it.
const RUN_LIMIT: Duration = Duration::from_secs(20 * 60);

#[tokio::main]
async fn main() {
    match tokio::time::timeout(RUN_LIMIT, bench()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("console bench failed: {e:#}"),
        Err(_) => panic!("console bench took over {RUN_LIMIT:?}: a browser command hung"),
    }
}

async fn bench() -> anyhow::Result<()> {
    let render_runs = env_or("BENCH_RENDER_RUNS", 5);
    let marks = env_or("BENCH_MARKS", 300);
    let busy_per_sec = env_or("BENCH_BUSY_PER_SEC", 100);
    let window = Duration::from_secs(env_or("BENCH_COST_SECS", 15) as u64);
    let binary = binary();
    // First, so that a missing Chromium or chromedriver fails at once.
    let browser = Browser::start().await;
    let large_sessions = env_or("BENCH_LARGE_SESSIONS", 10_000);
    if large_sessions > 0 {
        large::bench(&binary, &browser, large_sessions, render_runs).await?;
    }
    if env_or("BENCH_LARGE_ONLY", 0) == 1 {
        browser.close().await;
        return Ok(());
    }

    let console = free_addr();
    let listen = console.to_string();
    let mut flags: Vec<&str> = FLAGS.to_vec();
    flags.extend(["--console-listen", &listen]);
    let service = SessionProcess::start(&binary, &flags, &[]);
    service.channel().await;
    troupe_tests::http::wait_listening(console).await;
    let seeding = Instant::now();
    let tree = seed(&service).await;
    let rows = tree.len();
    println!(
        "seeded {rows} sessions in {TREES} trees (depths 0-3) in {:.1} s",
        seeding.elapsed().as_secs_f64()
    );
    let url = format!("http://{console}/#/w/{WORKSPACE}");

    println!("\n## Render after sign-in ({rows} rows)\n");
    println!("| run | submit to every row in the DOM (ms) | to the next frame's end (ms) |");
    println!("|---|---|---|");
    let (mut to_rows, mut to_frame) = (Vec::new(), Vec::new());
    for run in 1..=render_runs {
        let (r, f) = render_once(&browser, &url, rows).await?;
        println!("| {run} | {r:.1} | {f:.1} |");
        to_rows.push(r);
        to_frame.push(f);
        sign_out(&browser).await?;
    }
    println!("\nrows: {}\nframe: {}", stats(to_rows), stats(to_frame));

    println!("\n## Event to DOM ({marks} marks, 10/s; background {busy_per_sec}/s)\n");
    show_tree(&browser, &url, rows).await?;
    let clients = tree.clients(&service).await;
    let busy = Busy::start(&tree, clients.clone(), busy_per_sec);
    // The page replays the kept events after its snapshot: let it catch up.
    tokio::time::sleep(Duration::from_secs(3)).await;
    js(&browser, MARK_PROBE, Vec::new()).await?;
    let markers = tree.markers();
    let mut sent = Vec::with_capacity(marks);
    let mut calls = Vec::with_capacity(marks);
    let mut tick = tokio::time::interval(MARK_EVERY);
    for n in 0..marks {
        tick.tick().await;
        let mut client = clients[markers[n % markers.len()]].clone();
        let before = wall_ms();
        client
            .report_progress(pb::ReportProgressRequest {
                progress: 50,
                description: format!("mark-{n}"),
            })
            .await
            .context("mark")?;
        calls.push(wall_ms() - before);
        sent.push(before);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let seen = loop {
        let seen = js(&browser, "return window.__marks", Vec::new()).await?;
        let count = seen.as_object().map_or(0, |m| m.len());
        if count >= marks || Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let achieved = busy.stop().await;
    let seen: HashMap<usize, f64> = seen
        .as_object()
        .context("marks")?
        .iter()
        .filter_map(|(k, v)| Some((k.parse().ok()?, v.as_f64()?)))
        .collect();
    let latencies: Vec<f64> = (0..marks)
        .filter_map(|n| seen.get(&n).map(|at| at - sent[n]))
        .collect();
    let clock = js(
        &browser,
        "return performance.timeOrigin + performance.now() - Date.now()",
        Vec::new(),
    )
    .await?;
    println!(
        "mark's call to the mark in the DOM (ms): {}",
        stats(latencies)
    );
    println!("marks never seen in the DOM: {}", marks - seen.len());
    println!("the ReportProgress call itself (ms): {}", stats(calls));
    println!("background achieved: {achieved:.1} events/s");
    println!("page clock (timeOrigin + now) minus Date.now(): {clock} ms");
    sign_out(&browser).await?;

    println!("\n## The service's cost (window {} s)\n", window.as_secs());
    println!(
        "| console | load | pages | CPU (% of one core) | RSS (MiB) | background (events/s) |"
    );
    println!("|---|---|---|---|---|---|");
    let (_, stopped) = service.stop_keeping_data().await;
    let service = start(stopped, None);
    service.channel().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (cpu, rss) = cost(&service, window).await;
    println!("| off | at rest | 0 | {cpu:.2} | {rss:.1} | |");
    let busy = Busy::start(&tree, tree.clients(&service).await, busy_per_sec);
    let (cpu, rss) = cost(&service, window).await;
    println!(
        "| off | busy | 0 | {cpu:.2} | {rss:.1} | {:.1} |",
        busy.stop().await
    );

    let (_, stopped) = service.stop_keeping_data().await;
    let console = free_addr();
    let url = format!("http://{console}/#/w/{WORKSPACE}");
    let service = start(stopped, Some(console));
    service.channel().await;
    troupe_tests::http::wait_listening(console).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (cpu, rss) = cost(&service, window).await;
    println!("| on | at rest | 0 | {cpu:.2} | {rss:.1} | |");
    let busy = Busy::start(&tree, tree.clients(&service).await, busy_per_sec);
    let (cpu, rss) = cost(&service, window).await;
    println!(
        "| on | busy | 0 | {cpu:.2} | {rss:.1} | {:.1} |",
        busy.stop().await
    );

    // Ten browsers (Chromium processes), each with a page signed in on its
    // own: windows of one headless Chromium stalled WebDriver.
    let mut pages = Vec::new();
    for _ in 0..PAGES {
        let page = Browser::start().await;
        show_tree(&page, &url, rows).await?;
        pages.push(page);
    }
    let visibility = js(&pages[0], "return document.visibilityState", Vec::new()).await?;
    let busy = Busy::start(&tree, tree.clients(&service).await, busy_per_sec);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (cpu, rss) = cost(&service, window).await;
    println!(
        "| on | busy | {PAGES} (a headless Chromium each, {visibility}) | {cpu:.2} | {rss:.1} | {:.1} |",
        busy.stop().await
    );
    for page in pages {
        page.close().await;
    }
    ensure!(service.stop().await, "the service did not stop cleanly");
    browser.close().await;
    Ok(())
}
