//! OpenCode (`opencode serve`): one server for the whole session, on
//! 127.0.0.1 behind a password of its launcher's (HTTP Basic), one OpenCode
//! session in it. Each message is a prompt (`prompt_async`): one that comes
//! while OpenCode works is queued into the same run, before its next model
//! request; one that comes while it is idle starts the next turn. A turn
//! ends when OpenCode says the session is idle. A model call it retries
//! past [`MAX_RETRIES`] (a refusal of the gateway's, such as a spent
//! budget) aborts the turn. Its configuration comes in
//! `OPENCODE_CONFIG_CONTENT`: one provider, the gateway's Chat Completions
//! (`@ai-sdk/openai-compatible`, bundled with OpenCode, its key read from
//! `OPENAI_API_KEY`), the model for both its main and its small calls,
//! Troupe's MCP server, an agent `troupe` whose prompt is read from a file
//! (so nothing in it is taken for OpenCode's `{env:..}` or `{file:..}`),
//! every permission granted, sharing, updates, web fetch and its own
//! sub-agents off; models.dev and the update check stay unasked
//! (`OPENCODE_DISABLE_MODELS_FETCH`, `OPENCODE_DISABLE_AUTOUPDATE`). The
//! session is titled with the agent's name, so OpenCode makes no call to
//! title it. Its events about the session are the session's output, but
//! for the deltas of what it streams (each part comes whole when done).

use std::{net::SocketAddr, process::Stdio, time::Duration};

use anyhow::Context as _;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, StatusCode, body::Incoming, header};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    net::TcpStream,
    process::Command,
    sync::mpsc,
};

use super::{
    context::{Context, write_private},
    inbox::Inbox,
    turns::{print_line, turn_end},
};

/// Retries of one model call after which the turn is aborted.
pub(super) const MAX_RETRIES: u64 = 3;

/// How long the server may take to listen.
const START: Duration = Duration::from_secs(90);

/// How long one call of the server's may take.
const CALL: Duration = Duration::from_secs(30);

/// Most bytes of one answer or one event of the server's.
const MAX_BODY: usize = 16 << 20;

/// The configuration, as `OPENCODE_CONFIG_CONTENT`.
pub(super) fn config(ctx: &Context) -> Value {
    let model = format!("troupe/{}", ctx.model);
    json!({
        "provider": {"troupe": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "Troupe",
            "models": {ctx.model.as_str(): {}},
            "options": {"baseURL": ctx.openai_base_url, "apiKey": "{env:OPENAI_API_KEY}"},
        }},
        "model": model,
        "small_model": model,
        "autoupdate": false,
        "share": "disabled",
        "agent": {"troupe": {
            "mode": "primary",
            "prompt": format!("{{file:{}}}", ctx.file("prompt.md").display()),
        }},
        "default_agent": "troupe",
        "mcp": {"troupe": {
            "type": "local",
            "command": [ctx.mcp_command.to_string_lossy()],
            "enabled": true,
        }},
        "tools": {"webfetch": false, "task": false},
        // Nothing waits for a person's approval.
        "permission": "allow",
    })
}

/// Runs OpenCode until Troupe's stdin ends and its last turn is over (exit
/// code 0), or until its server stops (1).
pub(super) async fn run(ctx: &Context) -> anyhow::Result<i32> {
    write_private(&ctx.file("prompt.md"), &ctx.system_prompt())?;
    let password = uuid::Uuid::new_v4().simple().to_string();
    let mut child = Command::new("opencode")
        .env("OPENCODE_CONFIG_CONTENT", config(ctx).to_string())
        .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
        .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
        .env("OPENCODE_SERVER_PASSWORD", &password)
        .args(["serve", "--hostname", "127.0.0.1", "--port", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start opencode (is it on PATH in the image?)")?;
    let stdout = child.stdout.take().context("opencode's stdout")?;
    let addr = tokio::time::timeout(START, listening(stdout))
        .await
        .context("opencode's server did not start listening")??;
    let api = Api {
        addr,
        auth: format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("opencode:{password}"))
        ),
    };
    let mut events = api.events().await?;
    let title = json!({"title": ctx.session_id});
    let session = api.call(Method::POST, "/session", Some(title)).await?;
    let session = session["id"]
        .as_str()
        .context("opencode made a session without an id")?
        .to_owned();
    let mut turns = Turns::new(ctx, session);
    let mut inbox = Inbox::stdin();
    let mut open = true;
    let stopped = loop {
        tokio::select! {
            message = inbox.recv(), if open => match message {
                Some(text) => turns.prompt(&api, text).await?,
                None => open = false,
            },
            event = events.recv() => match event {
                Some(event) => turns.read(&api, event).await?,
                None => break true,
            },
        }
        if !open && !turns.busy {
            break false;
        }
    };
    if stopped {
        eprintln!("troupe-mcp agent: opencode's server stopped");
    } else {
        // Ends what its tools started (they outlive its server).
        let _ = api.call(Method::POST, "/global/dispose", None).await;
    }
    child.start_kill().ok();
    child.wait().await.context("the wait for opencode failed")?;
    Ok(i32::from(stopped))
}

/// Reads the server's stdout until it says where it listens, then passes
/// the rest on to stderr.
async fn listening(stdout: tokio::process::ChildStdout) -> anyhow::Result<SocketAddr> {
    const SAID: &str = "listening on http://";
    let mut lines = BufReader::new(stdout).lines();
    while let Some(line) = lines.next_line().await? {
        eprintln!("{line}");
        if let Some(at) = line.find(SAID) {
            let addr = line[at + SAID.len()..].trim().trim_end_matches('/');
            let addr = addr
                .parse()
                .with_context(|| format!("opencode listens on {addr}"))?;
            tokio::spawn(async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    eprintln!("{line}");
                }
            });
            return Ok(addr);
        }
    }
    anyhow::bail!("opencode exited before it listened")
}

/// OpenCode's server: plain HTTP on 127.0.0.1, the password in every call.
struct Api {
    addr: SocketAddr,
    auth: String,
}

impl Api {
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<hyper::Response<Incoming>> {
        let stream = TcpStream::connect(self.addr).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, self.addr.to_string())
            .header(header::AUTHORIZATION, &self.auth)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(
                body.map(|b| b.to_string()).unwrap_or_default(),
            )))?;
        Ok(sender.send_request(request).await?)
    }

    /// One call and its JSON answer (`null` for none).
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let what = format!("{method} {path}");
        let answer = async {
            let response = self.send(method, path, body).await?;
            let status = response.status();
            let bytes = Limited::new(response.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .to_bytes();
            if !status.is_success() {
                anyhow::bail!("{status}: {}", String::from_utf8_lossy(&bytes));
            }
            if status == StatusCode::NO_CONTENT || bytes.is_empty() {
                return Ok(Value::Null);
            }
            Ok(serde_json::from_slice(&bytes)?)
        };
        tokio::time::timeout(CALL, answer)
            .await
            .map_err(|_| anyhow::anyhow!("no answer in {CALL:?}"))
            .and_then(|a| a)
            .with_context(|| format!("opencode's server: {what}"))
    }

    /// The server's events (`GET /event`), once it said it is connected.
    async fn events(&self) -> anyhow::Result<mpsc::Receiver<Value>> {
        let response = self.send(Method::GET, "/event", None).await?;
        anyhow::ensure!(
            response.status().is_success(),
            "opencode's server refused its events: {}",
            response.status()
        );
        let (tx, mut rx) = mpsc::channel(256);
        tokio::spawn(read_events(response.into_body(), tx));
        match tokio::time::timeout(CALL, rx.recv()).await {
            Ok(Some(event)) if event["type"] == "server.connected" => Ok(rx),
            _ => anyhow::bail!("opencode's server sent no events"),
        }
    }
}

/// Server-sent events, each `data: JSON` and a blank line, as JSON values;
/// one longer than [`MAX_BODY`] is skipped.
async fn read_events(mut body: Incoming, tx: mpsc::Sender<Value>) {
    let mut buffer: Vec<u8> = Vec::new();
    let mut skipping = false;
    while let Some(Ok(frame)) = body.frame().await {
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buffer.extend_from_slice(&data);
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buffer.drain(..end + 2).collect();
            if std::mem::take(&mut skipping) {
                continue;
            }
            let text = String::from_utf8_lossy(&event);
            let data: String = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim_start)
                .collect();
            if let Ok(value) = serde_json::from_str::<Value>(&data)
                && tx.send(value).await.is_err()
            {
                return;
            }
        }
        if buffer.len() > MAX_BODY {
            buffer.clear();
            skipping = true;
        }
    }
}

/// The session's turns as the launcher follows them.
struct Turns<'a> {
    ctx: &'a Context,
    session: String,
    /// A turn runs: from a prompt (or OpenCode saying it is busy) to idle.
    busy: bool,
    /// Turns begun so far.
    count: u64,
    failed: bool,
    /// The last assistant message and its text parts, by part id.
    last: Option<(String, std::collections::BTreeMap<String, String>)>,
}

impl<'a> Turns<'a> {
    fn new(ctx: &'a Context, session: String) -> Turns<'a> {
        Turns {
            ctx,
            session,
            busy: false,
            count: 0,
            failed: false,
            last: None,
        }
    }

    fn begin(&mut self) {
        if !self.busy {
            self.busy = true;
            self.count += 1;
            self.failed = false;
            self.last = None;
        }
    }

    async fn prompt(&mut self, api: &Api, text: String) -> anyhow::Result<()> {
        let path = format!("/session/{}/prompt_async", self.session);
        let body = json!({"parts": [{"type": "text", "text": text}]});
        api.call(Method::POST, &path, Some(body)).await?;
        self.begin();
        Ok(())
    }

    /// One event of the server's: those of the session go out as its
    /// output, and follow its turns.
    async fn read(&mut self, api: &Api, event: Value) -> anyhow::Result<()> {
        let properties = &event["properties"];
        if properties["sessionID"] != self.session.as_str() {
            return Ok(());
        }
        let kind = event["type"].as_str().unwrap_or_default();
        if !kind.ends_with(".delta") {
            print_line(&event.to_string()).await?;
        }
        match kind {
            "session.status" => match properties["status"]["type"].as_str() {
                Some("busy") => self.begin(),
                Some("retry") if properties["status"]["attempt"].as_u64() >= Some(MAX_RETRIES) => {
                    eprintln!(
                        "troupe-mcp agent: opencode retried a model call {MAX_RETRIES} times: aborting the turn"
                    );
                    self.failed = true;
                    let path = format!("/session/{}/abort", self.session);
                    api.call(Method::POST, &path, None).await?;
                }
                _ => {}
            },
            "session.error" => self.failed = true,
            "message.updated" if properties["info"]["role"] == "assistant" => {
                let id = properties["info"]["id"].as_str().unwrap_or_default();
                if self.last.as_ref().is_none_or(|(last, _)| last != id) {
                    self.last = Some((id.to_owned(), Default::default()));
                }
            }
            "message.part.updated" if properties["part"]["type"] == "text" => {
                let part = &properties["part"];
                if let (Some((message, texts)), Some(id), Some(text)) = (
                    self.last.as_mut(),
                    part["id"].as_str(),
                    part["text"].as_str(),
                ) && part["messageID"] == message.as_str()
                {
                    texts.insert(id.to_owned(), text.to_owned());
                }
            }
            "session.idle" if self.busy => print_line(&self.end()).await?,
            _ => {}
        }
        Ok(())
    }

    /// Ends the turn; returns its last line.
    fn end(&mut self) -> String {
        self.busy = false;
        let answer = self
            .last
            .take()
            .map(|(_, texts)| texts.into_values().collect::<String>())
            .filter(|a| !a.is_empty());
        turn_end(
            self.ctx,
            self.count,
            i32::from(self.failed),
            answer.as_deref(),
        )
    }
}

#[cfg(test)]
mod tests {
    use troupe_proto::agent::Runtime;

    use super::*;
    use crate::agent::context::tests::context;

    #[test]
    fn the_config_reads_its_prompt_from_a_file() {
        let mut ctx = context(Runtime::OpenCode, std::path::Path::new("/h"));
        ctx.prompt = "{env:TROUPE_SESSION_TOKEN}".into();
        let config = config(&ctx);
        assert_eq!(
            config["agent"]["troupe"]["prompt"],
            "{file:/h/.troupe/opencode/prompt.md}"
        );
        assert!(!config.to_string().contains("{env:TROUPE"), "{config}");
        assert_eq!(config["model"], "troupe/m-1");
        assert_eq!(config["permission"], "allow");
        assert_eq!(
            config["provider"]["troupe"]["options"]["baseURL"],
            "http://127.0.0.1:4100/v1"
        );
    }

    #[tokio::test]
    async fn a_turn_runs_from_busy_to_idle_and_ends_with_the_last_answer() {
        let ctx = context(Runtime::OpenCode, std::path::Path::new("/h"));
        let api = Api {
            addr: "127.0.0.1:9".parse().unwrap(),
            auth: String::new(),
        };
        let mut turns = Turns::new(&ctx, "ses_1".into());
        let event = |kind: &str, properties: Value| json!({"type": kind, "properties": properties});
        for e in [
            event(
                "session.status",
                json!({"sessionID": "ses_1", "status": {"type": "busy"}}),
            ),
            event(
                "message.updated",
                json!({"sessionID": "ses_1", "info": {"id": "msg_u", "role": "user"}}),
            ),
            event(
                "message.part.updated",
                json!({"sessionID": "ses_1",
                "part": {"id": "prt_0", "messageID": "msg_u", "type": "text", "text": "the task"}}),
            ),
            event(
                "message.updated",
                json!({"sessionID": "ses_1", "info": {"id": "msg_a", "role": "assistant"}}),
            ),
            event(
                "message.part.updated",
                json!({"sessionID": "ses_1",
                "part": {"id": "prt_1", "messageID": "msg_a", "type": "text", "text": "calling"}}),
            ),
            // Another session's events are not this one's.
            event("session.idle", json!({"sessionID": "ses_other"})),
            event(
                "message.updated",
                json!({"sessionID": "ses_1", "info": {"id": "msg_b", "role": "assistant"}}),
            ),
            event(
                "message.part.updated",
                json!({"sessionID": "ses_1",
                "part": {"id": "prt_2", "messageID": "msg_b", "type": "text", "text": "do"}}),
            ),
            event(
                "message.part.updated",
                json!({"sessionID": "ses_1",
                "part": {"id": "prt_3", "messageID": "msg_b", "type": "text", "text": "ne"}}),
            ),
        ] {
            turns.read(&api, e).await.unwrap();
        }
        assert!(turns.busy);
        let line: Value = serde_json::from_str(&turns.end()).unwrap();
        assert_eq!(line["turn"], 1);
        assert_eq!(line["answer"], "done");
        assert_eq!(line["exit_code"], 0);
        // A second turn, failed, with no answer.
        turns
            .read(
                &api,
                event(
                    "session.status",
                    json!({"sessionID": "ses_1", "status": {"type": "busy"}}),
                ),
            )
            .await
            .unwrap();
        turns
            .read(&api, event("session.error", json!({"sessionID": "ses_1"})))
            .await
            .unwrap();
        let line: Value = serde_json::from_str(&turns.end()).unwrap();
        assert_eq!(line["turn"], 2);
        assert_eq!(line["answer"], Value::Null);
        assert_eq!(line["exit_code"], 1);
        assert!(!turns.busy);
    }
}
