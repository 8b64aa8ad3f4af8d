//! The model gateway's test setup: a session service whose gateway sends
//! its calls to a scripted upstream (an Anthropic provider `scripted`, an
//! OpenAI one `openai` and a Gemini one `gemini`, all on it), and what the gateway's tests assert
//! of a session's usage.

use std::time::Duration;

use bytes::Bytes;
use hyper::body::Incoming;
use serde_json::{Value, json};
use troupe_proto::session::{self as pb, TrustLevel};
use troupe_session_svc::{Config, model::TokenUsage};

use crate::{
    TestServer,
    http::{self, Answer},
    upstream::{Turn, Upstream, Usage},
};

pub const KEY: &str = "sk-ant-provider-key-never-in-a-container";
pub const MODEL: &str = "claude-test";
pub const LIMIT: Duration = Duration::from_secs(20);

/// $3/M input, $15/M output, $0.30/M cache read, $3.75/M cache write.
pub fn config(upstream: &str, key_file: &std::path::Path, timeouts: &str) -> String {
    format!(
        r#"
providers:
  scripted:
    kind: anthropic
    base_url: {upstream}
    key_file: {key}
    models:
      {MODEL}: {{ input: "3", output: "15", cache_read: "0.30", cache_write: "3.75" }}
      claude-other: {{ input: "1", output: "1" }}
  openai:
    kind: openai
    base_url: {upstream}
    key_file: {key}
    models:
      gpt-test: {{ input: "2.50", output: "10", cache_read: "1.25", max_output_tokens: 300 }}
  gemini:
    kind: gemini
    base_url: {upstream}
    key_file: {key}
    models:
      gemini-test: {{ input: "1.25", output: "10", cache_read: "0.125", max_output_tokens: 400 }}
access:
  workspaces:
    narrow: [claude-other]
{timeouts}
"#,
        key = key_file.display()
    )
}

pub struct Setup {
    pub server: TestServer,
    pub upstream: Upstream,
    _dir: tempfile::TempDir,
}

impl Setup {
    pub async fn new(turns: Vec<Turn>) -> Setup {
        Setup::with_timeouts(turns, "").await
    }

    pub async fn with_timeouts(turns: Vec<Turn>, timeouts: &str) -> Setup {
        Setup::configured(turns, timeouts, |_| {}).await
    }

    /// As [`Setup::new`], the server's configuration changed by `adjust` too.
    pub async fn with_config(turns: Vec<Turn>, adjust: impl FnOnce(&mut Config)) -> Setup {
        Setup::configured(turns, "", adjust).await
    }

    async fn configured(
        turns: Vec<Turn>,
        timeouts: &str,
        adjust: impl FnOnce(&mut Config),
    ) -> Setup {
        let upstream = Upstream::tcp(turns).await;
        let base_url = upstream.base_url();
        Setup::build(upstream, &base_url, None, timeouts, adjust, |t| t).await
    }

    /// As [`Setup::new`], with the gateway's configuration (as
    /// [`config`] writes it) changed by `edit`: a provider's own fields.
    pub async fn edited(turns: Vec<Turn>, edit: impl FnOnce(String) -> String) -> Setup {
        let upstream = Upstream::tcp(turns).await;
        let base_url = upstream.base_url();
        Setup::build(upstream, &base_url, None, "", |_| {}, edit).await
    }

    /// A service whose providers are `upstream` at `base_url` (a TLS one's
    /// `https://` URL, by IP or name), trusting the CA `ca_pem` if given
    /// (each provider's `ca_file`).
    pub async fn over(upstream: Upstream, base_url: &str, ca_pem: Option<&str>) -> Setup {
        Setup::build(upstream, base_url, ca_pem, "", |_| {}, |t| t).await
    }

    async fn build(
        upstream: Upstream,
        base_url: &str,
        ca_pem: Option<&str>,
        timeouts: &str,
        adjust: impl FnOnce(&mut Config),
        edit: impl FnOnce(String) -> String,
    ) -> Setup {
        let dir = tempfile::tempdir().expect("temp dir");
        let key = dir.path().join("key");
        std::fs::write(&key, format!("{KEY}\n")).expect("key file");
        let mut text = config(base_url, &key, timeouts);
        if let Some(pem) = ca_pem {
            let ca = dir.path().join("ca.pem");
            std::fs::write(&ca, pem).expect("CA file");
            let key_line = format!("key_file: {}", key.display());
            text = text.replace(
                &key_line,
                &format!("{key_line}\n    ca_file: {}", ca.display()),
            );
        }
        let file = dir.path().join("gateway.yaml");
        std::fs::write(&file, edit(text)).expect("config");
        let server = TestServer::start_with(|c| {
            c.gateway_config = Some(file);
            adjust(c);
        })
        .await;
        Setup {
            server,
            upstream,
            _dir: dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.addr)
    }

    pub async fn root(&self, workspace: &str, budget: Option<pb::Budget>) -> (String, String) {
        let (session, token) = root_of(&self.server, workspace, budget).await;
        (session.session_id, token)
    }

    /// Opens a streamed call of [`MODEL`] as `token`, asserts that it
    /// answered 200, and reads its first piece; returns that piece and the
    /// body, still open.
    pub async fn open_stream(&self, token: &str) -> (Bytes, Incoming) {
        let (status, mut body) = http::post_stream(
            &self.url("/v1/messages"),
            &[("x-api-key", token)],
            &request(MODEL, true),
        )
        .await;
        assert_eq!(status, 200);
        let first = http::next_chunk(&mut body).await.expect("message_start");
        (first, body)
    }

    pub async fn call(&self, token: &str, stream: bool) -> Answer {
        self.call_model(token, MODEL, stream).await
    }

    pub async fn call_model(&self, token: &str, model: &str, stream: bool) -> Answer {
        http::post(
            &self.url("/v1/messages?beta=true"),
            &[("x-api-key", token), ("anthropic-version", "2023-06-01")],
            &request(model, stream),
            LIMIT,
        )
        .await
    }

    pub async fn usage(&self, session_id: &str) -> pb::SessionUsage {
        self.server
            .get(session_id)
            .await
            .session
            .expect("session")
            .usage
            .expect("usage")
    }
}

/// Creates a direct root session of agent `worker` in `workspace` on
/// `server`, with `budget`; returns it and its token.
pub async fn root_of(
    server: &TestServer,
    workspace: &str,
    budget: Option<pb::Budget>,
) -> (pb::Session, String) {
    let response = server
        .operator()
        .await
        .create_root_session(pb::CreateRootSessionRequest {
            workspace_id: workspace.to_owned(),
            trust_level: TrustLevel::Direct as i32,
            agent_name: "worker".to_owned(),
            budget,
            ..Default::default()
        })
        .await
        .expect("root")
        .into_inner();
    (response.session.expect("session"), response.session_token)
}

pub fn request(model: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "max_tokens": 1000,
        "stream": stream,
        "messages": [{"role": "user", "content": "hello"}],
    })
}

pub fn body_len(model: &str, stream: bool) -> u64 {
    request(model, stream).to_string().len() as u64
}

pub const USAGE: Usage = Usage {
    input_tokens: 1_234,
    output_tokens: 567,
    cache_read_input_tokens: 10_000,
    cache_creation_input_tokens: 2_000,
};

/// 1,234 × $3/M + 567 × $15/M + 10,000 × $0.30/M + 2,000 × $3.75/M.
pub const USAGE_COST: u64 =
    1_234 * 3_000_000 + 567 * 15_000_000 + 10_000 * 300_000 + 2_000 * 3_750_000;

pub fn assert_metered(usage: &pb::SessionUsage, calls: u64, tokens: TokenUsage, cost: u64) {
    let own = usage.own_tokens.expect("own tokens");
    assert_eq!(usage.own_calls, calls, "{usage:?}");
    assert_eq!(
        (own.input, own.output, own.cache_read, own.cache_write),
        (
            tokens.input,
            tokens.output,
            tokens.cache_read,
            tokens.cache_write
        ),
        "{usage:?}"
    );
    assert_eq!(usage.own_cost_pico_usd, cost, "{usage:?}");
    assert_eq!(usage.subtree_cost_pico_usd, cost, "{usage:?}");
    assert_eq!(usage.subtree_tokens, tokens.total(), "{usage:?}");
    assert_eq!(
        (
            usage.reserved_calls,
            usage.reserved_tokens,
            usage.reserved_cost_pico_usd
        ),
        (0, 0, 0),
        "nothing stays reserved: {usage:?}"
    );
}

pub fn scripted() -> TokenUsage {
    TokenUsage {
        input: 1_234,
        output: 567,
        cache_read: 10_000,
        cache_write: 2_000,
    }
}

/// Polls `session_id`'s usage until nothing is reserved (a relay settles
/// just after its last byte).
pub async fn settled(setup: &Setup, session_id: &str) -> pb::SessionUsage {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let usage = setup.usage(session_id).await;
        if usage.reserved_calls == 0 {
            return usage;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still reserved: {usage:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn counted_nothing() -> TokenUsage {
    TokenUsage::default()
}

/// $2.50/M input, $10/M output, $1.25/M cached input.
pub const GPT_COST: u64 = 1_234 * 2_500_000 + 567 * 10_000_000 + 10_000 * 1_250_000;

/// Two calls' worth of `tokens`.
pub fn twice(tokens: TokenUsage) -> TokenUsage {
    TokenUsage {
        input: 2 * tokens.input,
        output: 2 * tokens.output,
        cache_read: 2 * tokens.cache_read,
        cache_write: 2 * tokens.cache_write,
    }
}

pub fn gpt_tokens() -> TokenUsage {
    TokenUsage {
        input: 1_234,
        output: 567,
        cache_read: 10_000,
        cache_write: 0,
    }
}

/// $1.25/M input, $10/M output, $0.125/M cached input.
pub const GEMINI_COST: u64 = 1_234 * 1_250_000 + 567 * 10_000_000 + 10_000 * 125_000;

pub fn chat(stream: bool) -> Value {
    json!({"model": "gpt-test", "stream": stream,
           "messages": [{"role": "user", "content": "hello"}]})
}
