//! Model API calls as a benchmark's client makes them ([`Api`], [`call`]),
//! and a session service whose gateway serves the four APIs from one
//! scripted upstream ([`gateway_server`]): shared by the gateway's bench and
//! its comparison with another gateway.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use serde_json::json;
use troupe_proto::session::{self as pb, TrustLevel};

use crate::{TestServer, upstream::Upstream};

/// The key the gateway sends the upstream.
pub const UPSTREAM_KEY: &str = "sk-bench";

pub type Http = Client<HttpConnector, Full<Bytes>>;

/// The APIs the gateway speaks, as a client calls each.
#[derive(Clone, Copy)]
pub enum Api {
    Messages,
    Chat,
    Responses,
    Gemini,
}

impl Api {
    pub const ALL: [Api; 4] = [Api::Messages, Api::Chat, Api::Responses, Api::Gemini];

    pub fn name(self) -> &'static str {
        match self {
            Api::Messages => "Anthropic Messages",
            Api::Chat => "OpenAI Chat Completions",
            Api::Responses => "OpenAI Responses",
            Api::Gemini => "Gemini",
        }
    }

    /// The path of a streamed call.
    pub fn path(self) -> &'static str {
        match self {
            Api::Messages => "/v1/messages",
            Api::Chat => "/v1/chat/completions",
            Api::Responses => "/v1/responses",
            Api::Gemini => "/v1beta/models/gemini-bench:streamGenerateContent?alt=sse",
        }
    }

    pub fn body(self, stream: bool) -> serde_json::Value {
        match self {
            Api::Messages => json!({"model": "claude-bench", "max_tokens": 100, "stream": stream,
                                    "messages": [{"role": "user", "content": "hi"}]}),
            Api::Chat => {
                json!({"model": "gpt-bench", "max_completion_tokens": 100, "stream": stream,
                                "messages": [{"role": "user", "content": "hi"}]})
            }
            Api::Responses => json!({"model": "gpt-bench", "max_output_tokens": 100,
                                     "stream": stream, "input": "hi"}),
            Api::Gemini => json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
                                  "generationConfig": {"maxOutputTokens": 100}}),
        }
    }

    /// The header that carries the key, and its value.
    pub fn key(self, key: &str) -> (&'static str, String) {
        match self {
            Api::Messages => ("x-api-key", key.to_owned()),
            Api::Chat | Api::Responses => ("authorization", format!("Bearer {key}")),
            Api::Gemini => ("x-goog-api-key", key.to_owned()),
        }
    }
}

pub fn request(api: Api, url: &str, key: &str, stream: bool) -> Request<Full<Bytes>> {
    let (name, value) = api.key(key);
    Request::post(url)
        .header(name, value)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(api.body(stream).to_string())))
        .unwrap()
}

/// What a call's answer took.
pub struct Answer {
    /// From sending to the first body bytes.
    pub first: Duration,
    /// From the first body bytes to the last.
    pub rest: Duration,
    pub bytes: usize,
}

/// Sends a call and reads its answer whole.
pub async fn call(http: &Http, api: Api, url: &str, key: &str, stream: bool) -> Answer {
    let start = Instant::now();
    let response = http
        .request(request(api, url, key, stream))
        .await
        .expect("answer");
    assert!(response.status().is_success(), "{}", response.status());
    let mut body = response.into_body();
    let mut first = None;
    let mut bytes = 0;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("body").into_data() {
            first.get_or_insert_with(Instant::now);
            bytes += data.len();
        }
    }
    let first = first.unwrap_or_else(Instant::now);
    Answer {
        first: first - start,
        rest: first.elapsed(),
        bytes,
    }
}

/// A client for [`call`].
pub fn client() -> Http {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// A session service (bench limits) whose gateway serves `claude-bench`
/// (Anthropic), `gpt-bench` (OpenAI) and `gemini-bench` (Gemini) from
/// `upstream`, and a root session with a budget that never binds: the
/// server, the root's creation, and the folder of the configuration.
pub async fn gateway_server(
    upstream: &Upstream,
) -> (TestServer, pb::CreateRootSessionResponse, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, UPSTREAM_KEY).unwrap();
    let file = dir.path().join("gateway.yaml");
    std::fs::write(
        &file,
        format!(
            "providers:\n  scripted:\n    kind: anthropic\n    base_url: {url}\n    key_file: {key}\n    \
             models:\n      claude-bench: {{ input: \"3\", output: \"15\" }}\n\
             \x20 openai:\n    kind: openai\n    base_url: {url}\n    key_file: {key}\n    \
             models:\n      gpt-bench: {{ input: \"2.50\", output: \"10\" }}\n\
             \x20 gemini:\n    kind: gemini\n    base_url: {url}\n    key_file: {key}\n    \
             models:\n      gemini-bench: {{ input: \"1.25\", output: \"10\" }}\n",
            url = upstream.base_url(),
            key = key.display()
        ),
    )
    .unwrap();
    let server = TestServer::start_with(|c| {
        super::unlimited(c);
        c.gateway_config = Some(file);
    })
    .await;
    let root = server
        .operator()
        .await
        .create_root_session(pb::CreateRootSessionRequest {
            workspace_id: "bench".into(),
            trust_level: TrustLevel::Direct as i32,
            agent_name: "worker".into(),
            budget: Some(pb::Budget {
                cost_pico_usd: Some(1_000_000_000_000_000),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    (server, root, dir)
}
