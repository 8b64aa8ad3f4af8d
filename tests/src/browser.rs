//! A real browser for the console's tests and bench: Debian's Chromium,
//! headless, driven through `chromedriver` (WebDriver) by fantoccini.
//! `scripts/test` installs both packages when they are missing; without
//! them [`Browser::start`] panics at once, saying so.
//!
//! A failed step leaves a screenshot, `<target>/console-screenshots/<step>.png`.

use std::{
    path::PathBuf,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, anyhow};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

/// How long a step waits for what the page should come to show.
pub const PAGE_WAIT: Duration = Duration::from_secs(60);

pub struct Browser {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

/// The Chromium binary (the package's own, not its wrapper script).
fn chromium() -> PathBuf {
    let real = PathBuf::from("/usr/lib/chromium/chromium");
    if real.is_file() {
        real
    } else {
        PathBuf::from("/usr/bin/chromium")
    }
}

/// Where failed steps' screenshots go: the workspace's `target/`.
pub fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("console-screenshots")
}

impl Browser {
    /// Starts chromedriver on a free loopback port and a headless Chromium
    /// through it, with a fresh profile; panics if either is missing or no
    /// browser session opens within [`PAGE_WAIT`].
    pub async fn start() -> Browser {
        let port = crate::ports::free_addr().port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // A group of its own, with the Chromium it starts: dropping the
            // browser (a test that panicked) kills them all, never leaving
            // a Chromium behind.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver runs (apt-get install chromium-driver; scripts/test does)");
        let profile = tempfile::tempdir().expect("a profile directory");
        let capabilities = json!({
            "goog:chromeOptions": {
                "binary": chromium(),
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", "--window-size=1400,1000",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }
        });
        let capabilities = capabilities.as_object().cloned().expect("an object");
        let deadline = Instant::now() + PAGE_WAIT;
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(capabilities.clone())
                .connect(&format!("http://127.0.0.1:{port}"))
                .await
            {
                Ok(client) => break client,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("no browser session through chromedriver: {e}"),
            }
        };
        Browser {
            client,
            driver,
            _profile: profile,
        }
    }

    /// Runs `script` (a function body) in the page; its return value.
    pub async fn js(&self, script: &str) -> anyhow::Result<Value> {
        self.client
            .execute(script, Vec::new())
            .await
            .with_context(|| format!("script failed: {script}"))
    }

    /// Polls `script` until it returns something truthy (not null, false,
    /// 0 or ""), within [`PAGE_WAIT`]; returns that value.
    pub async fn until(&self, what: &str, script: &str) -> anyhow::Result<Value> {
        let deadline = Instant::now() + PAGE_WAIT;
        loop {
            let value = self.js(script).await?;
            let truthy = match &value {
                Value::Null | Value::Bool(false) => false,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return Ok(value);
            }
            if Instant::now() > deadline {
                return Err(anyhow!("the page never showed {what} (last: {value})"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn goto(&self, url: &str) -> anyhow::Result<()> {
        self.client
            .goto(url)
            .await
            .with_context(|| format!("goto {url}"))
    }

    /// Types `text` into the element `css` names.
    pub async fn type_into(&self, css: &str, text: &str) -> anyhow::Result<()> {
        let element = self.wait_for(css).await?;
        element.clear().await?;
        element.send_keys(text).await?;
        Ok(())
    }

    /// Clicks the element `css` names; again if the page replaced it
    /// between finding and clicking.
    pub async fn click(&self, css: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + PAGE_WAIT;
        loop {
            match self.wait_for(css).await?.click().await {
                Ok(()) => return Ok(()),
                Err(e) if e.to_string().contains("stale element") && Instant::now() < deadline => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub async fn wait_for(&self, css: &str) -> anyhow::Result<fantoccini::elements::Element> {
        self.client
            .wait()
            .at_most(PAGE_WAIT)
            .for_element(Locator::Css(css))
            .await
            .with_context(|| format!("no element {css}"))
    }

    /// Saves a screenshot as `<dir>/<name>.png`.
    pub async fn screenshot(&self, name: &str) {
        let dir = screenshot_dir();
        let _ = std::fs::create_dir_all(&dir);
        match self.client.screenshot().await {
            Ok(png) => {
                let path = dir.join(format!("{name}.png"));
                let _ = std::fs::write(&path, png);
                eprintln!("screenshot of the failed step: {}", path.display());
            }
            Err(e) => eprintln!("no screenshot: {e}"),
        }
    }

    /// Runs one step; if it fails, keeps a screenshot and fails the test.
    pub async fn step(
        &self,
        name: &str,
        step: impl std::future::Future<Output = anyhow::Result<()>>,
    ) {
        if let Err(e) = step.await {
            self.screenshot(name).await;
            panic!("step {name} failed: {e:#}");
        }
    }

    pub async fn close(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Browser {
    /// Kills chromedriver's process group: the driver and every Chromium
    /// process it started, however the test ended.
    fn drop(&mut self) {
        if let Some(pid) = self.driver.id() {
            let group = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        }
    }
}
