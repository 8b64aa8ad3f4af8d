//! Troupe's gateway beside the LiteLLM proxy, the gateway most users would
//! pick instead, in one run against the same scripted upstream on loopback,
//! for each API both speak (Anthropic Messages, OpenAI Chat Completions and
//! Responses, Gemini):
//!
//! - time to first token of a streamed call through each proxy, interleaved
//!   call by call with direct calls, which are its baseline; each proxy in
//!   a phase of its own, so one's background work (LiteLLM's Python after
//!   each call) does not land in the other's figures;
//! - calls per second with 32 callers at once (not streamed), and CPU per
//!   call: the whole run's (this process, which holds the callers, the
//!   upstream and Troupe's service, plus LiteLLM's processes), and the
//!   proxy's own: LiteLLM's processes', or for Troupe the whole run's less
//!   that of the same load sent directly.
//!
//! LiteLLM 1.110.2 runs as its docs advise for speed: one worker on
//! granian, no database, no callbacks, no logging of messages, offline. Its
//! master key is every caller's key; Troupe's callers use a session's token,
//! and each call is reserved and settled against the session's budgets.
//!
//! Run: `cargo bench -p troupe-tests --bench litellm`. LiteLLM comes from
//! `TROUPE_LITELLM` (the path of its `litellm`), else `scripts/litellm-env`
//! installs it (PyPI); without PyPI the bench says it is skipped.

use std::{
    os::unix::process::CommandExt,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use troupe_tests::{
    bench::{
        api::{self, Api, Http, UPSTREAM_KEY, call},
        percentile,
    },
    upstream::{Turn, Upstream},
};

/// The allocator the `troupe-session` binary runs on.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const TTFT_CALLS: usize = 1_000;
const WARM_UP: usize = 30;
const CALLERS: usize = 32;
const LOAD: Duration = Duration::from_secs(10);
const MASTER_KEY: &str = "sk-litellm-bench-master";
/// CPU time is counted in ticks of 1/100 s in /proc.
const TICK: Duration = Duration::from_millis(10);

/// The LiteLLM proxy, stopped (its whole process group) when dropped.
struct LiteLlm {
    child: Child,
    url: String,
}

impl Drop for LiteLlm {
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(-(self.child.id() as i32));
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// The `litellm` executable: `TROUPE_LITELLM`, else scripts/litellm-env's.
fn litellm_path() -> Option<String> {
    if let Ok(path) = std::env::var("TROUPE_LITELLM") {
        return Some(path);
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/litellm-env");
    let out = Command::new(script)
        .output()
        .expect("run scripts/litellm-env");
    match out.status.code() {
        Some(0) => Some(
            String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .last()
                .expect("a path")
                .to_owned(),
        ),
        Some(3) => None,
        _ => panic!(
            "scripts/litellm-env failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Starts LiteLLM's proxy on a free port, its models at `upstream`, and
/// waits until it answers.
async fn start_litellm(path: &str, upstream: &str, dir: &std::path::Path) -> LiteLlm {
    let config = dir.join("litellm.yaml");
    std::fs::write(
        &config,
        format!(
            "model_list:\n\
             \x20 - model_name: claude-bench\n    litellm_params: {{model: anthropic/claude-bench, api_base: \"{upstream}\", api_key: {UPSTREAM_KEY}}}\n\
             \x20 - model_name: gpt-bench\n    litellm_params: {{model: openai/gpt-bench, api_base: \"{upstream}/v1\", api_key: {UPSTREAM_KEY}}}\n\
             \x20 - model_name: gemini-bench\n    litellm_params: {{model: gemini/gemini-bench, api_base: \"{upstream}/v1beta\", api_key: {UPSTREAM_KEY}}}\n\
             litellm_settings: {{callbacks: [], success_callback: [], failure_callback: [], service_callback: [], \
             cache: false, set_verbose: false, json_logs: false, turn_off_message_logging: true, \
             request_timeout: 60, num_retries: 0}}\n\
             general_settings: {{master_key: {MASTER_KEY}, disable_spend_logs: true, disable_error_logs: true, \
             disable_reset_budget: true, store_model_in_db: false, background_health_checks: false}}\n"
        ),
    )
    .unwrap();
    let addr = troupe_tests::ports::free_addr();
    let child = Command::new(path)
        .args(["--config", config.to_str().unwrap(), "--host", "127.0.0.1"])
        .args(["--port", &addr.port().to_string(), "--num_workers", "1"])
        .arg("--run_granian")
        .envs([
            ("LITELLM_OFFLINE_MODE", "true"),
            ("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
            ("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", "True"),
            ("LITELLM_TELEMETRY_DISABLED", "true"),
            ("LITELLM_LOG", "ERROR"),
            ("LITELLM_MODE", "PRODUCTION"),
            ("LITELLM_DISABLE_LATEST_RELEASE_CHECK", "true"),
            ("DISABLE_ADMIN_UI", "True"),
            ("NO_DOCS", "True"),
            ("NO_REDOC", "True"),
        ])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start litellm");
    let proxy = LiteLlm {
        child,
        url: format!("http://{addr}"),
    };
    let http = api::client();
    let health: hyper::Uri = format!("{}/health/liveliness", proxy.url).parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if let Ok(answer) = http.get(health.clone()).await
            && answer.status().is_success()
        {
            return proxy;
        }
        assert!(Instant::now() < deadline, "LiteLLM did not start in 180 s");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// CPU time (user and system) of `pid` and every process below it.
fn tree_cpu(pid: u32) -> Duration {
    let mut stats = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // After the command's closing parenthesis: state, ppid, ... utime
        // (the 14th field), stime (15th).
        let Some((head, rest)) = text.rsplit_once(") ") else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let own: u32 = head.split(' ').next().unwrap_or("0").parse().unwrap_or(0);
        let parent: u32 = fields[1].parse().unwrap_or(0);
        let ticks: u64 =
            fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
        stats.push((own, parent, ticks));
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(stats.iter().filter(|s| s.1 == parent).map(|s| s.0));
        i += 1;
    }
    let ticks: u64 = stats
        .iter()
        .filter(|s| tree.contains(&s.0))
        .map(|s| s.2)
        .sum();
    TICK * ticks as u32
}

/// CPU time (user and system) of this process so far.
fn own_cpu() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    let time =
        |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1_000);
    time(usage.user_time()) + time(usage.system_time())
}

struct Target {
    name: &'static str,
    url: String,
    key: String,
}

#[tokio::main]
async fn main() {
    let _ = nix::sys::prctl::set_thp_disable(true);
    let Some(path) = litellm_path() else {
        println!("SKIPPED: LiteLLM cannot be installed (PyPI unreachable)");
        return;
    };
    let upstream = Upstream::tcp(vec![]).await;
    let (server, root, dir) = api::gateway_server(&upstream).await;
    let litellm = start_litellm(&path, &upstream.base_url(), dir.path()).await;
    let http = api::client();
    let targets = [
        Target {
            name: "direct",
            url: upstream.base_url(),
            key: UPSTREAM_KEY.to_owned(),
        },
        Target {
            name: "Troupe",
            url: format!("http://{}", server.addr),
            key: root.session_token.clone(),
        },
        Target {
            name: "LiteLLM",
            url: litellm.url.clone(),
            key: MASTER_KEY.to_owned(),
        },
    ];

    println!(
        "| time to first token, ms | direct p50 / p99 (Troupe's phase) | Troupe p50 / p99 (added) | LiteLLM p50 / p99 (added) |"
    );
    println!("|---|---|---|---|");
    for api in Api::ALL {
        first_token(&http, &upstream, api, &targets).await;
    }
    println!();
    println!(
        "| {CALLERS} callers, not streamed | calls/s | CPU per call, ms (whole run) | the proxy's own CPU per call, ms |"
    );
    println!("|---|---|---|---|");
    for api in Api::ALL {
        let mut direct_cpu = 0.0;
        for target in &targets {
            let (rate, whole, proxy) =
                load(&http, &upstream, api, target, litellm.child.id()).await;
            let own = match target.name {
                "direct" => {
                    direct_cpu = whole;
                    "-".to_owned()
                }
                "Troupe" => format!("{:.3}", whole - direct_cpu),
                _ => format!("{proxy:.3}"),
            };
            println!(
                "| {} {} | {rate:.0} | {whole:.3} | {own} |",
                api.name(),
                target.name
            );
        }
    }
    drop(litellm);
}

/// Time to first token of `api`: each proxy's calls interleaved call by
/// call with direct ones, in a phase of its own (so neither proxy's
/// background work lands in the other's figures); the direct calls of each
/// phase are its baseline.
async fn first_token(http: &Http, upstream: &Upstream, api: Api, targets: &[Target]) {
    let ms = |t: Duration| t.as_secs_f64() * 1e3;
    let mut cells = Vec::new();
    let mut direct = (0.0, 0.0);
    for proxy in &targets[1..] {
        let pair = [&targets[0], proxy];
        for _ in 0..(TTFT_CALLS + WARM_UP) * pair.len() {
            upstream.push(Turn::text("first token"));
        }
        let mut times = [Vec::new(), Vec::new()];
        for i in 0..TTFT_CALLS + WARM_UP {
            for (t, target) in pair.iter().enumerate() {
                let url = format!("{}{}", target.url, api.path());
                let first = call(http, api, &url, &target.key, true).await.first;
                if i >= WARM_UP {
                    times[t].push(first);
                }
            }
        }
        let [base, through] = times.map(|mut t| {
            t.sort();
            (ms(percentile(&t, 50.0)), ms(percentile(&t, 99.0)))
        });
        if cells.is_empty() {
            direct = base;
        }
        cells.push(format!(
            "{:.2} / {:.2} (+{:.2} / +{:.2})",
            through.0,
            through.1,
            through.0 - base.0,
            through.1 - base.1
        ));
    }
    println!(
        "| {} | {:.2} / {:.2} | {} |",
        api.name(),
        direct.0,
        direct.1,
        cells.join(" | ")
    );
}

/// Calls per second of `api` to `target` with CALLERS callers for LOAD, and
/// CPU per call in ms: the whole run's, and LiteLLM's processes' alone.
async fn load(
    http: &Http,
    upstream: &Upstream,
    api: Api,
    target: &Target,
    litellm: u32,
) -> (f64, f64, f64) {
    let url = format!(
        "{}{}",
        target.url,
        api.path()
            .replace("streamGenerateContent?alt=sse", "generateContent")
    );
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    for _ in upstream.turns_left()..20_000 {
        upstream.push(Turn::text("x"));
    }
    let (own0, proxy0) = (own_cpu(), tree_cpu(litellm));
    let started = Instant::now();
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (http, url, key) = (http.clone(), url.clone(), target.key.clone());
            let (done, stop) = (done.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    call(&http, api, &url, &key, false).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // The upstream is kept a few thousand turns ahead of the callers.
    while started.elapsed() < LOAD {
        for _ in upstream.turns_left()..20_000 {
            upstream.push(Turn::text("x"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        caller.await.unwrap();
    }
    let elapsed = started.elapsed();
    let calls = done.load(Ordering::Relaxed) as f64;
    let proxy = (tree_cpu(litellm) - proxy0).as_secs_f64() * 1e3 / calls;
    let own = (own_cpu() - own0).as_secs_f64() * 1e3 / calls;
    let proxy = if target.name == "LiteLLM" { proxy } else { 0.0 };
    // The whole run: this process, and LiteLLM's when it carried the calls.
    (calls / elapsed.as_secs_f64(), own + proxy, proxy)
}
