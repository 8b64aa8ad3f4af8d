//! Codex (`codex app-server`): one process for the whole session, driven
//! over its JSON-RPC on stdio (one JSON object per line). The session's
//! first message starts a turn of one thread (`turn/start`); a message that
//! comes while a turn runs joins it (`turn/steer`: Codex puts it before its
//! next model request, dropping an answer still streaming), and one that
//! comes between turns starts the next. Codex asks nothing of its client
//! with approvals off; a request it makes all the same is refused. Its
//! configuration (`$CODEX_HOME/config.toml`) names the gateway as its only
//! provider (Responses, no WebSocket, no retries of a refused call),
//! Troupe's MCP server with the variables it needs passed on by name
//! (`env_vars`: Codex gives its servers a trimmed environment), approvals
//! off and no sandbox of its own (the container and the session's write
//! scope are the sandbox), plugins, analytics, web search and update checks
//! off, so it calls nothing but its model; the system prompt is its
//! `developer_instructions`. Its notifications are the session's output,
//! but for the deltas of what it streams (each item comes whole when done).

use std::{collections::HashMap, process::Stdio};

use anyhow::Context as _;
use serde_json::{Value, json};
use tokio::{
    io::{AsyncWrite, AsyncWriteExt},
    process::Command,
    sync::mpsc,
};

use super::{
    context::{Context, write_private},
    inbox::{Inbox, lines},
    turns::{exit_code, print_line, turn_end},
};

fn home(ctx: &Context) -> std::path::PathBuf {
    ctx.home.join(".codex")
}

/// `text` as a TOML basic string: JSON's escapes are TOML's, and DEL, which
/// JSON leaves as it is, must be escaped in TOML.
fn toml_string(text: &str) -> String {
    serde_json::Value::from(text)
        .to_string()
        .replace('\u{7f}', "\\u007F")
}

/// The configuration, as `config.toml`.
pub(super) fn config(ctx: &Context) -> String {
    let env_vars = ctx
        .forwarded
        .iter()
        .map(|name| toml_string(name))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"model = {model}
model_provider = "troupe"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
web_search = "disabled"
developer_instructions = {instructions}

[analytics]
enabled = false

[features]
plugins = false

[model_providers.troupe]
name = "Troupe"
base_url = {base_url}
env_key = "OPENAI_API_KEY"
wire_api = "responses"
supports_websockets = false
request_max_retries = 0
stream_max_retries = 0

[mcp_servers.troupe]
command = {mcp}
args = []
env_vars = [{env_vars}]
"#,
        model = toml_string(&ctx.model),
        instructions = toml_string(&ctx.system_prompt()),
        base_url = toml_string(&ctx.openai_base_url),
        mcp = toml_string(&ctx.mcp_command.to_string_lossy()),
    )
}

/// Runs Codex until Troupe's stdin ends and its last turn is over, or until
/// Codex exits; returns its exit code.
pub(super) async fn run(ctx: &Context) -> anyhow::Result<i32> {
    let home = home(ctx);
    write_private(&home.join("config.toml"), &config(ctx))?;
    let mut child = Command::new("codex")
        .env("CODEX_HOME", &home)
        .arg("app-server")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start codex (is it on PATH in the image?)")?;
    let mut server = Server {
        stdin: Box::new(child.stdin.take().context("codex's stdin")?),
        lines: lines(child.stdout.take().context("codex's stdout")?, 64, |line| {
            Some(line.to_owned())
        }),
        next_id: 0,
    };
    server
        .call(
            "initialize",
            json!({"clientInfo": {"name": "troupe", "title": "Troupe",
                                  "version": env!("CARGO_PKG_VERSION")}}),
        )
        .await?;
    server.send(&json!({"method": "initialized"})).await?;
    let cwd = std::env::current_dir().context("no working directory")?;
    let started = server.call("thread/start", json!({"cwd": cwd})).await?;
    let thread = started["thread"]["id"]
        .as_str()
        .context("codex started a thread without an id")?
        .to_owned();
    let mut turns = Turns::new(ctx, thread);
    let mut inbox = Inbox::stdin();
    let mut open = true;
    loop {
        tokio::select! {
            message = inbox.recv(), if open => match message {
                Some(text) => turns.deliver(&mut server, text).await?,
                None => open = false,
            },
            line = server.lines.recv() => match line {
                Some(line) => turns.read(&mut server, &line).await?,
                None => break,
            },
        }
        if !open && turns.idle() {
            break;
        }
    }
    // Its stdin closed, Codex ends.
    drop(server);
    let status = child.wait().await.context("the wait for codex failed")?;
    Ok(exit_code(status))
}

/// The app-server's end of the pipes.
struct Server {
    stdin: Box<dyn AsyncWrite + Unpin + Send>,
    lines: mpsc::Receiver<String>,
    next_id: u64,
}

impl Server {
    async fn send(&mut self, message: &Value) -> anyhow::Result<()> {
        let mut line = message.to_string();
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .await
            .context("codex stopped reading")
    }

    /// Sends a request; returns its id.
    async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<u64> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"method": method, "id": id, "params": params}))
            .await?;
        Ok(id)
    }

    /// Sends a request and waits for its answer, printing what comes before
    /// it: only before the first turn, when nothing else is asked.
    async fn call(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.request(method, params).await?;
        while let Some(line) = self.lines.recv().await {
            let message: Value = serde_json::from_str(&line).unwrap_or_default();
            if message["id"] == id && message.get("method").is_none() {
                if let Some(error) = message.get("error") {
                    anyhow::bail!("codex refused {method}: {error}");
                }
                return Ok(message["result"].clone());
            }
            forward(&line, &message).await?;
        }
        anyhow::bail!("codex exited before it answered {method}")
    }
}

/// What a request of ours carried, until its answer comes.
enum Asked {
    Start,
    Steer(String),
}

/// The thread's turns as the launcher follows them.
struct Turns<'a> {
    ctx: &'a Context,
    thread: String,
    /// The turn running, once Codex said it started.
    active: Option<String>,
    /// Turns started so far.
    count: u64,
    answer: Option<String>,
    asked: HashMap<u64, Asked>,
    /// Messages that came while a start was asked for.
    waiting: Vec<String>,
}

impl<'a> Turns<'a> {
    fn new(ctx: &'a Context, thread: String) -> Turns<'a> {
        Turns {
            ctx,
            thread,
            active: None,
            count: 0,
            answer: None,
            asked: HashMap::new(),
            waiting: Vec::new(),
        }
    }

    /// No turn runs, none is asked for and no message waits.
    fn idle(&self) -> bool {
        self.active.is_none() && self.asked.is_empty() && self.waiting.is_empty()
    }

    /// `text` joins the running turn, or starts one; while a start is
    /// asked for, it waits for the turn's id.
    async fn deliver(&mut self, server: &mut Server, text: String) -> anyhow::Result<()> {
        if self.asked.values().any(|a| matches!(a, Asked::Start)) {
            self.waiting.push(text);
            return Ok(());
        }
        let (method, params, asked) = match &self.active {
            Some(turn) => (
                "turn/steer",
                json!({"threadId": self.thread, "expectedTurnId": turn, "input": input(&text)}),
                Asked::Steer(text),
            ),
            None => (
                "turn/start",
                json!({"threadId": self.thread, "input": input(&text)}),
                Asked::Start,
            ),
        };
        let id = server.request(method, params).await?;
        self.asked.insert(id, asked);
        Ok(())
    }

    /// Delivers what waited for a start's answer.
    async fn deliver_waiting(&mut self, server: &mut Server) -> anyhow::Result<()> {
        for text in std::mem::take(&mut self.waiting) {
            self.deliver(server, text).await?;
        }
        Ok(())
    }

    /// One line from Codex: an answer to a request of ours, a request of
    /// its own, or a notification, which goes out as the session's output.
    async fn read(&mut self, server: &mut Server, line: &str) -> anyhow::Result<()> {
        let message: Value = serde_json::from_str(line).unwrap_or_default();
        let method = message["method"].as_str();
        match (message.get("id"), method) {
            (Some(id), Some(method)) => {
                // Nothing is asked of a client with approvals off: refuse.
                server
                    .send(&json!({"id": id, "error": {"code": -32601,
                        "message": format!("Troupe's launcher does not answer {method}")}}))
                    .await?;
            }
            (Some(id), None) => {
                let asked = id.as_u64().and_then(|id| self.asked.remove(&id));
                match (asked, message.get("error")) {
                    (Some(Asked::Start), None) => {
                        self.active = message["result"]["turn"]["id"].as_str().map(str::to_owned);
                        self.deliver_waiting(server).await?;
                    }
                    (Some(Asked::Start), Some(error)) => {
                        eprintln!("troupe-mcp agent: codex refused a message: {error}");
                        self.deliver_waiting(server).await?;
                    }
                    // The turn ended before the steer: the text starts the next.
                    (Some(Asked::Steer(text)), Some(_)) => self.deliver(server, text).await?,
                    _ => {}
                }
                return Ok(());
            }
            (None, Some(method)) => self.notified(method, &message["params"]).await?,
            (None, None) => {}
        }
        forward(line, &message).await
    }

    async fn notified(&mut self, method: &str, params: &Value) -> anyhow::Result<()> {
        match method {
            "turn/started" => {
                self.active = params["turn"]["id"].as_str().map(str::to_owned);
                self.count += 1;
                self.answer = None;
            }
            "item/completed" if params["item"]["type"] == "agentMessage" => {
                self.answer = params["item"]["text"].as_str().map(str::to_owned);
            }
            "turn/completed" => {
                self.active = None;
                let code = if params["turn"]["status"] == "completed" {
                    0
                } else {
                    1
                };
                print_line(&turn_end(
                    self.ctx,
                    self.count,
                    code,
                    self.answer.take().as_deref(),
                ))
                .await?;
            }
            _ => {}
        }
        Ok(())
    }
}

/// A message as the input of a turn.
fn input(text: &str) -> Value {
    json!([{"type": "text", "text": text, "text_elements": []}])
}

/// Prints a line of Codex's as the session's output, unless it is a delta
/// of something that comes whole when done, or its rate-limit notice.
async fn forward(line: &str, message: &Value) -> anyhow::Result<()> {
    let method = message["method"].as_str().unwrap_or_default();
    if method.ends_with("/delta") || method.ends_with("Delta") || method.starts_with("account/") {
        return Ok(());
    }
    print_line(line).await?;
    Ok(())
}
#[cfg(test)]
mod tests {
    use troupe_proto::agent::Runtime;

    use tokio::io::{AsyncBufReadExt, BufReader};

    use super::*;
    use crate::agent::context::tests::context;

    #[test]
    fn the_config_names_the_gateway_the_bridge_and_the_prompt() {
        let mut ctx = context(Runtime::Codex, std::path::Path::new("/h"));
        ctx.prompt = "Quote \" backslash \\ newline\n tab\t del\u{7f} end".into();
        let text = config(&ctx);
        assert!(text.contains("model = \"m-1\"\n"), "{text}");
        assert!(
            text.contains("base_url = \"http://127.0.0.1:4100/v1\""),
            "{text}"
        );
        assert!(
            text.contains("command = \"/opt/troupe/bin/troupe-mcp\""),
            "{text}"
        );
        assert!(
            text.contains("env_vars = [\"TROUPE_SESSION_ENDPOINT\", \"TROUPE_SESSION_TOKEN\"]"),
            "{text}"
        );
        let line = text
            .lines()
            .find(|l| l.starts_with("developer_instructions = "))
            .unwrap();
        assert!(
            line.contains(
                r#"Quote \" backslash \\ newline\n tab\t del\u007F end\n\nYou are a member"#
            ),
            "{line}"
        );
    }

    #[tokio::test]
    async fn a_message_joins_the_running_turn_and_starts_the_next() {
        let ctx = context(Runtime::Codex, std::path::Path::new("/h"));
        let (mut server, mut sent, _to_us) = server();
        let mut turns = Turns::new(&ctx, "th".into());
        turns.deliver(&mut server, "first".into()).await.unwrap();
        let start = next(&mut sent).await;
        assert_eq!(start["method"], "turn/start");
        assert_eq!(start["params"]["input"][0]["text"], "first");
        // Before the start is answered, a message waits for the turn's id.
        turns.deliver(&mut server, "second".into()).await.unwrap();
        assert!(!turns.idle());
        let started = r#"{"id":1,"result":{"turn":{"id":"t1","status":"inProgress"}}}"#;
        turns.read(&mut server, started).await.unwrap();
        let steer = next(&mut sent).await;
        assert_eq!(steer["method"], "turn/steer");
        assert_eq!(steer["params"]["expectedTurnId"], "t1");
        assert_eq!(steer["params"]["input"][0]["text"], "second");
        // The turn ends before the steer lands: the text starts the next.
        let ended =
            r#"{"method":"turn/completed","params":{"turn":{"id":"t1","status":"completed"}}}"#;
        turns.read(&mut server, ended).await.unwrap();
        let late = r#"{"id":2,"error":{"code":-32600,"message":"no active turn to steer"}}"#;
        turns.read(&mut server, late).await.unwrap();
        let restart = next(&mut sent).await;
        assert_eq!(restart["method"], "turn/start");
        assert_eq!(restart["params"]["input"][0]["text"], "second");
        let again = r#"{"id":3,"result":{"turn":{"id":"t2"}}}"#;
        turns.read(&mut server, again).await.unwrap();
        assert!(!turns.idle());
        let ended =
            r#"{"method":"turn/completed","params":{"turn":{"id":"t2","status":"failed"}}}"#;
        turns.read(&mut server, ended).await.unwrap();
        assert!(turns.idle());
    }

    #[tokio::test]
    async fn a_request_of_codexs_is_refused() {
        let ctx = context(Runtime::Codex, std::path::Path::new("/h"));
        let (mut server, mut sent, _to_us) = server();
        let mut turns = Turns::new(&ctx, "th".into());
        turns
            .read(
                &mut server,
                r#"{"id":0,"method":"item/commandExecution/requestApproval","params":{}}"#,
            )
            .await
            .unwrap();
        let answer = next(&mut sent).await;
        assert_eq!(answer["id"], 0);
        assert_eq!(answer["error"]["code"], -32601);
    }

    type Sent = tokio::io::Lines<BufReader<tokio::io::DuplexStream>>;

    /// A server whose stdin the test reads, and a sender of its lines.
    fn server() -> (Server, Sent, mpsc::Sender<String>) {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let (tx, rx) = mpsc::channel(8);
        let server = Server {
            stdin: Box::new(ours),
            lines: rx,
            next_id: 0,
        };
        (server, BufReader::new(theirs).lines(), tx)
    }

    async fn next(sent: &mut Sent) -> Value {
        serde_json::from_str(&sent.next_line().await.unwrap().unwrap()).unwrap()
    }
}
